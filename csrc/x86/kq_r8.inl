// What the R8 k-quant row kernels of every level share (csrc/x86/{avx2,avx512}/kq_r8.cpp; the
// layouts: csrc/repack.h): the Q8_K activation block's offsets, 32-byte pshufb controls and
// constants, and the prefetch step of a group's super-block. Included inside each level's
// anonymous namespace, so built with that level's flags only (256-bit vectors: AVX2 and up).

#define LB_R8_INLINE inline __attribute__((always_inline))

constexpr int QBLK = 292, QOFF_QS = 4, QOFF_BS = 260;  // block_q8_K: float d, qs[256], bsums[16]
static_assert(sizeof(block_q8_K) == QBLK, "q8_K layout");

LB_R8_INLINE int32_t ld32(const uint8_t *p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// 32 bytes of a pshufb control or constant; ctl(c) loads it
struct alignas(32) Ctl { uint8_t b[32]; };
LB_R8_INLINE __m256i ctl(const Ctl &c) { return _mm256_load_si256((const __m256i *)c.b); }
// pshufb controls (per 128-bit lane, so both lanes alike): bytes 2P, 2P + 1 of each dword
// zero-extended to two int16 (the mins pairs against the bsums pairs)
constexpr Ctl pair_ctl(int P) {
    Ctl c{};
    for (int i = 0; i < 32; ++i) c.b[i] = (i % 2 == 0) ? (uint8_t)((i % 16) / 4 * 4 + 2 * P + (i % 4) / 2) : 0x80;
    return c;
}
constexpr Ctl kPair[2] = {pair_ctl(0), pair_ctl(1)};
constexpr Ctl splat(uint8_t v) {
    Ctl c{};
    for (int i = 0; i < 32; ++i) c.b[i] = v;
    return c;
}
constexpr Ctl k3F = splat(0x3F), k30 = splat(0x30);

// Super-block o of a group (kGroup bytes, nb of them a group): the pass that streams it (t0 == 0)
// asks for the lines ahead; a later pass reads it from L1, and meanwhile the next group's
// super-block comes to L2, so the stream from DRAM does not stop while this pass computes.
template <size_t kGroup>
LB_R8_INLINE void prefetch_group(const uint8_t *o, int64_t nb, int t0) {
    if (t0 == 0) {
        prefetch_ahead(o, kGroup);
    } else {
        const uint8_t *next = o + (size_t)nb * kGroup;
        for (size_t l = 0; l < kGroup; l += 64) _mm_prefetch((const char *)next + l, _MM_HINT_T1);
    }
}
