// Ternary row kernels: I2_S x I8_S (BitNet b1.58, bitnet.cpp's x86 layout), TQ2_0 x Q8_K and
// TQ1_0 x Q8_K (ggml's ternary types). Shared body of csrc/x86/{avx2,avx2vnni,avx512}/
// ternary.cpp; the including file defines LOWBIT_ISA (ISA_AVX2, ISA_AVX2VNNI or ISA_AVX512)
// and LOWBIT_NS (the level's namespace), and is built with that level's flags only.
//
// Contract (csrc/kernels.h, DESIGN.md): out[t * out_stride + r] = dot(W[r], act[t]) for r in
// [r0, r1), t < nt; layouts and arithmetic are csrc/ref/ternary.cpp's (the spec).
//
// Every level gives BITWISE the scalar reference's result, for every nt:
//   - integer sums are exact (bounds below), and an exact integer sum does not depend on the
//     order or grouping of its terms, so lanes, tokens and blocks may be summed in any tree;
//   - the float steps after them are the reference's scalar steps, done lane-wise (an SSE
//     lane rounds exactly like the scalar op): I2_S  (float)(S - act_sum) / act_scale * w_scale
//     once per (row, token); TQ*  sumf = sumf + (float)S_b * (d_act * d_w) per block, in
//     block order, no fma.
// So a token's result depends on neither nt (I2) nor the row split (I3).
//
// Window: the kernels are templates on NT (1..8). A weight block is decoded once per window
// into code vectors (codes 0..3 as unsigned bytes); each token then costs only its
// multiply-adds: maddubs (avx2: u8 codes x s8 activations -> int16 pairs) or dpbusd
// (avx2vnni, avx512: -> int32 quads). Per-token accumulators are the named registers s0..s7
// (and u0..u3 / u8), fanned out by LB_TN_EACH, never an array (I7). The decode is split in
// phases of two code vectors so that 8 tokens' accumulators + 2 codes fit in 16 ymm.
//
// I2_S has one inner body, i2s_row (one row, a window of NT tokens, codes from a source), used
// by the row kernels (codes decoded in place) and by the GEMM for prompt chunks (a tile's codes
// decoded once into an L1 scratch, then every 8-token window of the chunk): the block step, the
// avx2 int16 fold schedule and the finish exist once. On avx2 the one-token form (GEMV) decodes
// planes 0 and 2 as 4 x code (one shift per block instead of three) into a second int16
// accumulator with its own fold bound (I2S_GEMV_FOLD_N); see the static_asserts.
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "../kernels.h"
#include "hsum.h"
#include "prefetch.h"

#ifndef LOWBIT_ISA
#error "define LOWBIT_ISA and LOWBIT_NS before including ternary.inl"
#endif

// LOWBIT_ISA names an enum (invisible to #if), so the preprocessor branches on the level's own
// compiler flags; the static_assert below ties the two together.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define LB_TN_ISA 3
#elif defined(__AVXVNNI__)
#define LB_TN_ISA 2
#elif defined(__AVX2__)
#define LB_TN_ISA 1
#else
#error "ternary.inl needs at least AVX2"
#endif

namespace lowbit {
namespace LOWBIT_NS {
namespace {

static_assert(LB_TN_ISA == LOWBIT_ISA, "LOWBIT_ISA does not match this level's compiler flags");

#define LB_TN_INLINE inline __attribute__((always_inline))

// X(t) for every token slot; each use is guarded by `if constexpr (NT > t)`.
#define LB_TN_EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

using VY = __m256i;
#if LB_TN_ISA == 3
using VZ = __m512i;
#endif

LB_TN_INLINE VY ldy(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
LB_TN_INLINE VY zy() { return _mm256_setzero_si256(); }

// Vector constants live in one table and are read through a pointer that passes an empty
// volatile asm at each decode phase (kc()). GCC 12 would otherwise build every constant by a
// GPR broadcast, hoist it into a register for the whole row loop and, with 8 token
// accumulators in the register file, spill it (I7); it also rewrites some compares with known
// constants into two instructions. Through kc() they stay memory operands at their use.
struct alignas(64) Consts {
    int8_t m3[64];        // 3: a 2-bit field
    int8_t m12[32];       // 0x0C: a 2-bit field at bits 3:2 (I2_S GEMV: 4 x code)
    int8_t bias[32];      // 0x80 (TQ1_0: bytes kept biased, see trit())
    int8_t k86[32];       // 85 - 128:  biased x >s this  <=>  x >= 86
    int8_t k171[32];      // 170 - 128: biased x >s this  <=>  x >= 171
    int16_t one16[16];    // 1
    int16_t qh_pow[16];   // 0 x 8, then 1 1 3 3 9 9 27 27 (TQ1_0 qh products, upper 128 bits)
    int16_t lo8[16];      // 0x00FF
    int16_t hi8[16];      // 0xFF00
    int16_t sh_6_4[32];   // avx512 I2_S: per-half srlv counts 6 | 4
    int16_t sh_2_0[32];   //                                  2 | 0
};
template <int N, class T>
constexpr void fill(T *p, T v, int from = 0) { for (int i = from; i < N; ++i) p[i] = v; }
constexpr Consts make_consts() {
    Consts c{};
    fill<64>(c.m3, (int8_t)3);
    fill<32>(c.m12, (int8_t)0x0C);
    fill<32>(c.bias, (int8_t)-128);
    fill<32>(c.k86, (int8_t)(85 - 128));
    fill<32>(c.k171, (int8_t)(170 - 128));
    fill<16>(c.one16, (int16_t)1);
    const int16_t pw[8] = {1, 1, 3, 3, 9, 9, 27, 27};
    for (int i = 0; i < 8; ++i) c.qh_pow[8 + i] = pw[i];
    fill<16>(c.lo8, (int16_t)0x00FF);
    fill<16>(c.hi8, (int16_t)-256);
    fill<16>(c.sh_6_4, (int16_t)6); fill<32>(c.sh_6_4, (int16_t)4, 16);
    fill<16>(c.sh_2_0, (int16_t)2); fill<32>(c.sh_2_0, (int16_t)0, 16);
    return c;
}
constexpr Consts kConsts = make_consts();
// L (launder) only where the register file needs it (checked with tools/check_spills.py):
// elsewhere GCC's hoisted constants are free, while a laundered pointer costs a move and
// unfused constant loads per phase. TQ1_0's decode needs ~10 constants: always laundered.
template <bool L>
LB_TN_INLINE const Consts *kc() {
    const Consts *p = &kConsts;
    if constexpr (L) __asm__ volatile("" : "+r"(p));
    return p;
}
LB_TN_INLINE VY cy(const void *p) { return _mm256_load_si256((const __m256i *)p); }

// An accumulator passes through an empty asm after each step: GCC otherwise reassociates the
// (associative) integer adds of consecutive phases and keeps a whole phase's products alive
// across the next decode, which spills 8 tokens' worth of ymm to the stack (I7).
LB_TN_INLINE VY pin(VY v) { __asm__("" : "+x"(v)); return v; }

// ---- per-token multiply-add steps on 32-byte code vectors -----------------------------------
// dot2(acc, ca, qa, cb, qb): acc += ca . qa + cb . qb, where ca, cb hold unsigned codes 0..3
// and qa, qb point at 32 signed activation bytes.
//   avx2: acc holds int16 lanes; lane j gets c[2j] q[2j] + c[2j+1] q[2j+1] from each maddubs
//         (|.| <= 2 * 3 * 128 = 768: maddubs never saturates on these operands).
//   vnni: acc holds int32 lanes; lane j gets the 4 products 4j..4j+3 (dpbusd, no saturation).
// The _chain form adds into acc directly; the _tree form adds the two planes first and acc
// once, so that a row-long accumulator carries a 1-cycle add per step instead of two chained
// dpbusd (5 cycles each). On avx2 both are the same maddubs tree.
#if LB_TN_ISA == 1
LB_TN_INLINE VY dot2_tree(VY acc, VY ca, const void *qa, VY cb, const void *qb) {
    return _mm256_add_epi16(acc, _mm256_add_epi16(_mm256_maddubs_epi16(ca, ldy(qa)),
                                                  _mm256_maddubs_epi16(cb, ldy(qb))));
}
LB_TN_INLINE VY dot2_chain(VY acc, VY ca, const void *qa, VY cb, const void *qb) {
    return dot2_tree(acc, ca, qa, cb, qb);
}
#else
#if LB_TN_ISA == 2
LB_TN_INLINE VY dpby(VY acc, VY c, VY q) { return _mm256_dpbusd_avx_epi32(acc, c, q); }
#else
LB_TN_INLINE VY dpby(VY acc, VY c, VY q) { return _mm256_dpbusd_epi32(acc, c, q); }
#endif
LB_TN_INLINE VY dot2_tree(VY acc, VY ca, const void *qa, VY cb, const void *qb) {
    return _mm256_add_epi32(acc, dpby(dpby(zy(), ca, ldy(qa)), cb, ldy(qb)));
}
LB_TN_INLINE VY dot2_chain(VY acc, VY ca, const void *qa, VY cb, const void *qb) {
    return dpby(dpby(acc, ca, ldy(qa)), cb, ldy(qb));
}
#endif

#if LB_TN_ISA == 3
LB_TN_INLINE VZ pin(VZ v) { __asm__("" : "+v"(v)); return v; }
LB_TN_INLINE VZ ldz(const void *p) { return _mm512_loadu_si512(p); }
LB_TN_INLINE VZ zz() { return _mm512_setzero_si512(); }
LB_TN_INLINE VZ dpbz(VZ acc, VZ c, VZ q) { return _mm512_dpbusd_epi32(acc, c, q); }
LB_TN_INLINE VZ dot2z_tree(VZ acc, VZ ca, const void *qa, VZ cb, const void *qb) {
    return _mm512_add_epi32(acc, dpbz(dpbz(zz(), ca, ldz(qa)), cb, ldz(qb)));
}
LB_TN_INLINE VZ dot2z_chain(VZ acc, VZ ca, const void *qa, VZ cb, const void *qb) {
    return dpbz(dpbz(acc, ca, ldz(qa)), cb, ldz(qb));
}
// 32 code bytes broadcast to both halves, each half shifted right by its own count (16-bit
// lanes, counts from a Consts row sh_a_b) and masked to 2 bits: [(raw >> a) & 3 | (raw >> b) & 3].
LB_TN_INLINE VZ planes2z(VZ rawz, const int16_t *sh, const Consts *k) {
    return _mm512_and_si512(_mm512_srlv_epi16(rawz, _mm512_load_si512(sh)), _mm512_load_si512(k->m3));
}
// 32 bytes in both halves (the maskz form: GCC 12's plain one warns on its undefined source).
LB_TN_INLINE VZ bcast2(const void *p) { return _mm512_maskz_broadcast_i64x4((__mmask8)0xFF, ldy(p)); }
// 16 int32 lanes -> 8 (exact). The halves via __builtin_shufflevector: GCC 12's
// _mm512_castsi512_si256 / _mm512_extracti64x4_epi64 warn about their undefined source.
LB_TN_INLINE VY fold512(VZ v) {
    using v8di = long long __attribute__((vector_size(64)));
    const v8di d = (v8di)v;
    return _mm256_add_epi32((VY)__builtin_shufflevector(d, d, 0, 1, 2, 3), (VY)__builtin_shufflevector(d, d, 4, 5, 6, 7));
}
#endif

// ---- exact horizontal sums (hsum8_i32: hsum.h) ------------------------------------------------
// hpack<K>(m0..m3): lane t of the low half + lane t of the high half = sum of the 8 lanes of m_t
// (t < K; the other lanes repeat token 0's or 2's partial sums and are never read).
template <int K>
LB_TN_INLINE VY hpack(VY m0, VY m1, VY m2, VY m3) {
    if constexpr (K == 1) return _mm256_hadd_epi32(_mm256_hadd_epi32(m0, m0), _mm256_hadd_epi32(m0, m0));
    if constexpr (K == 2) return _mm256_hadd_epi32(_mm256_hadd_epi32(m0, m1), _mm256_hadd_epi32(m0, m1));
    if constexpr (K == 3) return _mm256_hadd_epi32(_mm256_hadd_epi32(m0, m1), _mm256_hadd_epi32(m2, m2));
    if constexpr (K >= 4) return _mm256_hadd_epi32(_mm256_hadd_epi32(m0, m1), _mm256_hadd_epi32(m2, m3));
}
LB_TN_INLINE __m128i halves(VY v) {
    return _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}
// xmm whose lane t < K is the exact sum of the 8 int32 lanes of m_t.
template <int K>
LB_TN_INLINE __m128i pack4(VY m0, VY m1, VY m2, VY m3) {
    if constexpr (K == 1) {
        __m128i x = halves(m0);
        x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
        return _mm_add_epi32(x, _mm_shuffle_epi32(x, 1));
    } else {
        return halves(hpack<K>(m0, m1, m2, m3));
    }
}

// ymm whose lane t < K is the exact sum of the 8 int32 lanes of m_t (K = 5..8).
template <int K>
LB_TN_INLINE VY pack8(VY m0, VY m1, VY m2, VY m3, VY m4, VY m5, VY m6, VY m7) {
    const VY pa = hpack<4>(m0, m1, m2, m3), pb = hpack<K - 4>(m4, m5, m6, m7);
    return _mm256_add_epi32(_mm256_permute2x128_si256(pa, pb, 0x20), _mm256_permute2x128_si256(pa, pb, 0x31));
}

template <int L>
LB_TN_INLINE void store_lane(float *p, __m128 v) {
    if constexpr (L == 0) _mm_store_ss(p, v);
    else _mm_store_ss(p, _mm_castsi128_ps(_mm_shuffle_epi32(_mm_castps_si128(v), L)));
}

// ============================================================================================
// I2_S x I8_S
// ============================================================================================
// Weights: 32 bytes per 128; byte j holds weights j, 32+j, 64+j, 96+j in bits 7:6, 5:4, 3:2,
// 1:0, so plane p = (raw >> (6 - 2p)) & 3 meets activations q[32p .. 32p + 31] of the block.
// Activations (I8_S row): float act_scale, int32 act_sum, int8 q[n].
//   S      = sum_k code_k * q_k                     (exact int32; |S| <= 3 * 128 * n)
//   result = (float)(S - act_sum) / act_scale * w_scale      (the reference's expression)
//
// avx2 (no VNNI): maddubs gives int16 lanes. Worst case per lane: a maddubs lane adds two
// products code * q with code <= 3 (the 2-bit field; 3 is never written by a quantizer but a
// corrupt or hand-built file may hold it) and q in [-128, 127] (I8_S stops at -127, raw bytes
// need not), and a block adds 4 planes into the lane. FOLD_N blocks are summed in int16 before
// the lane is widened (madd with ones, exact) into int32: the largest FOLD_N whose worst case
// still fits int16 on both sides.
constexpr int kI2sMaxCode = 3;
constexpr int kI8MaxPos = 127, kI8MaxNeg = 128;               // |q| bounds, by sign
constexpr int kI2sLanePos = 4 * 2 * kI2sMaxCode * kI8MaxPos;  // 3048 per block
constexpr int kI2sLaneNeg = 4 * 2 * kI2sMaxCode * kI8MaxNeg;  // 3072 per block
constexpr int kI2sFoldPos = 32767 / kI2sLanePos, kI2sFoldNeg = 32768 / kI2sLaneNeg;
constexpr int I2S_FOLD_N = kI2sFoldPos < kI2sFoldNeg ? kI2sFoldPos : kI2sFoldNeg;
static_assert(I2S_FOLD_N * kI2sLanePos <= 32767 && I2S_FOLD_N * kI2sLaneNeg <= 32768,
              "FOLD_N blocks of int16 maddubs partials must not overflow");
static_assert((I2S_FOLD_N + 1) * kI2sLanePos > 32767 || (I2S_FOLD_N + 1) * kI2sLaneNeg > 32768,
              "FOLD_N is the largest safe block count");
static_assert(I2S_FOLD_N == 10, "the issue's bound: floor(32767 / (4 * 2 * 3 * 127)) = 10");
// avx2 GEMV (one token): planes 1, 3 decode to codes (accumulator A), planes 0, 2 to 4 x code
// (accumulator B), which saves two shifts per block (Y4). Per block a lane of B adds 2 planes
// of 2 products 4 * code * q: the same bound gives the blocks B may sum before a fold; a fold
// adds A + B / 4 (an exact arithmetic shift: B is a multiple of 4) into int32 via madd.
constexpr int kI2sGemvLanePos = 2 * 2 * 4 * kI2sMaxCode * kI8MaxPos;  // 6096 per block
constexpr int kI2sGemvLaneNeg = 2 * 2 * 4 * kI2sMaxCode * kI8MaxNeg;  // 6144 per block
constexpr int I2S_GEMV_FOLD_N = 32767 / kI2sGemvLanePos < 32768 / kI2sGemvLaneNeg ? 32767 / kI2sGemvLanePos
                                                                                   : 32768 / kI2sGemvLaneNeg;
static_assert(I2S_GEMV_FOLD_N * kI2sGemvLanePos <= 32767 && I2S_GEMV_FOLD_N * kI2sGemvLaneNeg <= 32768,
              "GEMV: FOLD blocks of 4 x code partials must not overflow");
static_assert(I2S_GEMV_FOLD_N == 5, "floor(32767 / (2 * 2 * 4 * 3 * 127)) = 5");
// A and B / 4 each hold at most I2S_GEMV_FOLD_N * 2 * 2 * 3 * 128 = 7680: their sum fits int16
static_assert(2 * I2S_GEMV_FOLD_N * 2 * 2 * kI2sMaxCode * kI8MaxNeg <= 32768, "GEMV: A + B / 4 fits int16");

LB_TN_INLINE float i2s_finish(int64_t S, const uint8_t *hdr, float w_scale) {
    float act_scale;
    int32_t act_sum;
    std::memcpy(&act_scale, hdr, 4);
    std::memcpy(&act_sum, hdr + 4, 4);
    return (float)(S - act_sum) / act_scale * w_scale;
}

// Code sources: where a row's codes come from. The row kernel decodes the packed bytes in
// place (I2sPacked); the GEMM reads codes it decoded once per row tile into an L1 scratch
// (I2sPlanes). Both give the same code bytes (0..3, unsigned) for the same block, so the one
// body below (i2s_row) serves both, fold schedule included.
//   y01(b, k) -> planes 0, 1 of block b (meet q[0..31], q[32..63]); y23(b, k) -> planes 2, 3
//   z(b, k)   -> (avx512) [plane 0 | plane 1], [plane 2 | plane 3]
struct Y2 { VY a, b; };  // two code vectors (a struct: std::pair drops the vector attributes)
// avx2 GEMV form: planes 1 and 3 as codes, planes 0 and 2 as 4 x code (see i2s_row)
struct Y4 { VY c1, c3, c0x4, c2x4; };
#if LB_TN_ISA == 3
struct Z2 { VZ a, b; };
#endif
struct I2sPacked {
    const uint8_t *w;  // the row's raw bytes, 32 per block
    // The weight stream's prefetch: the line kPrefetchAhead bytes past block b. A block is half
    // a line, so i2s_row asks for it at the even blocks only (asking per block issued every
    // prefetch twice); every line is still asked for, since the even blocks' addresses step by
    // 64 bytes (by 32 where a row of an odd block count meets the next).
    LB_TN_INLINE void prefetch(int64_t b) const { prefetch_ahead(w + (size_t)b * 32, 64); }
    LB_TN_INLINE Y2 y01(int64_t b, const Consts *k) const {
        const VY raw = ldy(w + (size_t)b * 32);
        return {_mm256_and_si256(_mm256_srli_epi16(raw, 6), cy(k->m3)),
                _mm256_and_si256(_mm256_srli_epi16(raw, 4), cy(k->m3))};
    }
    LB_TN_INLINE Y2 y23(int64_t b, const Consts *k) const {
        const VY raw = ldy(w + (size_t)b * 32);  // re-read per phase: fewer live registers
        return {_mm256_and_si256(_mm256_srli_epi16(raw, 2), cy(k->m3)), _mm256_and_si256(raw, cy(k->m3))};
    }
    // One 16-bit shift by 4 brings bits 5:4 to 1:0 and bits 7:6 to 3:2 of each byte (the
    // neighbour byte's bits land at 7:4 and are masked off): 1 shift + 4 ands, not 3 + 4.
    LB_TN_INLINE Y4 y4(int64_t b, const Consts *k) const {
        const VY raw = ldy(w + (size_t)b * 32), hi = _mm256_srli_epi16(raw, 4);
        return {_mm256_and_si256(hi, cy(k->m3)), _mm256_and_si256(raw, cy(k->m3)),
                _mm256_and_si256(hi, cy(k->m12)), _mm256_and_si256(raw, cy(k->m12))};
    }
#if LB_TN_ISA == 3
    LB_TN_INLINE Z2 z(int64_t b, const Consts *k) const {
        const VZ rawz = bcast2(w + (size_t)b * 32);
        return {planes2z(rawz, k->sh_6_4, k), planes2z(rawz, k->sh_2_0, k)};
    }
#endif
};
// Decoded planes: 128 bytes per block, plane p (codes of weights 32p .. 32p + 31) at 32p.
struct I2sPlanes {
    const uint8_t *c;
    LB_TN_INLINE void prefetch(int64_t) const {}  // (the scratch is in L1)
    LB_TN_INLINE Y2 y01(int64_t b, const Consts *) const {
        return {ldy(c + (size_t)b * 128), ldy(c + (size_t)b * 128 + 32)};
    }
    LB_TN_INLINE Y2 y23(int64_t b, const Consts *) const {
        return {ldy(c + (size_t)b * 128 + 64), ldy(c + (size_t)b * 128 + 96)};
    }
    LB_TN_INLINE Y4 y4(int64_t b, const Consts *) const {
        const uint8_t *const p = c + (size_t)b * 128;
        return {ldy(p + 32), ldy(p + 96), _mm256_slli_epi16(ldy(p), 2), _mm256_slli_epi16(ldy(p + 64), 2)};
    }
#if LB_TN_ISA == 3
    LB_TN_INLINE Z2 z(int64_t b, const Consts *) const {
        return {ldz(c + (size_t)b * 128), ldz(c + (size_t)b * 128 + 64)};
    }
#endif
};
// The decode of I2sPacked, written to a I2sPlanes scratch: nb blocks of one row.
LB_TN_INLINE void i2s_decode_planes(const uint8_t *w, uint8_t *c, int64_t nb) {
    const Consts *const k = kc<false>();
    const I2sPacked src{w};
    for (int64_t b = 0; b < nb; ++b) {
        if (!(b & 1)) src.prefetch(b);
        const auto [c0, c1] = src.y01(b, k);
        const auto [c2, c3] = src.y23(b, k);
        uint8_t *const o = c + (size_t)b * 128;
        _mm256_storeu_si256((__m256i *)o, c0);
        _mm256_storeu_si256((__m256i *)(o + 32), c1);
        _mm256_storeu_si256((__m256i *)(o + 64), c2);
        _mm256_storeu_si256((__m256i *)(o + 96), c3);
    }
}

// One 128-weight block for every token, on 32-byte vectors (avx2 and avx2vnni share it; only
// dot2_tree differs): two phases of two planes, so that 8 accumulators + 2 codes + temporaries
// fit in 16 ymm. Expects s0..s7, qlo, qhi, st, src in scope.
#define LB_I2S_BLOCK_Y                                                                              \
    auto block = [&](int64_t b) __attribute__((always_inline)) {                                    \
        const size_t qo = (size_t)b * QK_I2S;                                                       \
        if (!(b & 1)) src.prefetch(b);                                                              \
        {   /* planes 0, 1: bits 7:6 and 5:4 -> q[0..63] of the block */                            \
            const auto [c0, c1] = src.y01(b, kc<kI2sLaunder<NT>>());                                \
            LB_TN_EACH(LB_I2S_STEP01)                                                               \
        }                                                                                           \
        {   /* planes 2, 3: bits 3:2 and 1:0 -> q[64..127] */                                       \
            const auto [c2, c3] = src.y23(b, kc<kI2sLaunder<NT>>());                                \
            LB_TN_EACH(LB_I2S_STEP23)                                                               \
        }                                                                                           \
    };
#define LB_I2S_STEP01(t) if constexpr (NT > t) s##t = pin(dot2_tree(s##t, c0, LB_TQ(t, qo), c1, LB_TQ(t, qo + 32)));
#define LB_I2S_STEP23(t) \
    if constexpr (NT > t) s##t = pin(kI2sChain<NT> ? dot2_chain(s##t, c2, LB_TQ(t, qo + 64), c3, LB_TQ(t, qo + 96)) \
                                                 : dot2_tree(s##t, c2, LB_TQ(t, qo + 64), c3, LB_TQ(t, qo + 96)));

// Row end on vnni levels: each token's 8 int32 lanes (registers v0..v7) to its output;
// tokens 5..8 are reduced together (pack8) so the reduction needs few registers.
#define LB_I2S_SUMS(v)                                                                              \
    if constexpr (NT <= 4) {                                                                        \
        if constexpr (NT > 0) LB_PUT(0, hsum8_i32(v##0));                                            \
        if constexpr (NT > 1) LB_PUT(1, hsum8_i32(v##1));                                            \
        if constexpr (NT > 2) LB_PUT(2, hsum8_i32(v##2));                                            \
        if constexpr (NT > 3) LB_PUT(3, hsum8_i32(v##3));                                            \
    } else {                                                                                        \
        const VY u8 = pack8<(NT > 4 ? NT : 5)>(v##0, v##1, v##2, v##3, v##4, v##5, v##6, v##7);     \
        const __m128i xa = _mm256_castsi256_si128(u8), xb = _mm256_extracti128_si256(u8, 1);        \
        LB_TN_EACH(LB_I2S_PUT8)                                                                     \
    }
#define LB_I2S_PUT8(t) if constexpr (NT > t) LB_PUT(t, _mm_extract_epi32((t) < 4 ? xa : xb, (t) & 3));

// vnni: a row-long accumulator fed by dpbusd directly carries its 5-cycle latency per step;
// with >= 6 tokens in flight the dpbusd throughput hides two chained steps per block, so one
// plane pair goes straight into the accumulator (no add) and only the other uses the tree.
template <int NT>
constexpr bool kI2sChain = LB_TN_ISA != 1 && NT >= 6;

// avx2 with 5..8 tokens: 8 int16 partials + the int32 sums + 2 codes fill the 16 ymm.
template <int NT>
constexpr bool kI2sLaunder = LB_TN_ISA == 1 && NT > 4;

// FOLD: blocks summed in int16 between folds (avx2 only; I2S_FOLD_N, or 1 for the
// LOWBIT_I2S_FOLD=1 variant). The same body serves nt = 1 and every window: the deferral is
// the loop structure below, not a per-nt choice.
// The one inner body of I2_S: row r's outputs for tokens t0 .. t0 + NT - 1 of `a`, codes from `src`
// (I2sPacked in the row kernels, I2sPlanes in the GEMM). The block step, the avx2 fold schedule
// (FOLD blocks of int16 partials, then a fold, and a fold at the row's tail) and the finish
// live only here, so the GEMM cannot differ from the row kernel in any of them.
template <int NT, int FOLD, class Src>
LB_TN_INLINE void i2s_row(const Src &src, const RowArgs &a, int64_t r, size_t t0 = 0) {
    const int64_t nb = a.n / QK_I2S;
    const size_t st = a.act_stride;
    const uint8_t *const act = a.act + t0 * st;  // the window's token 0
    float *const out = a.out + t0 * a.out_stride;
    // token t's q: (t < 4 ? qlo : qhi) + (t & 3) * st
    const uint8_t *const qlo = act + I8S_HEADER;
    const uint8_t *const qhi = qlo + 4 * st;
#define LB_TQ(t, off) (((t) < 4 ? qlo : qhi) + ((t) & 3) * st + (off))
    {
        // token t's result from its exact sum S (the header is re-read: it is in L1)
#define LB_PUT(t, S) out[(size_t)(t) * a.out_stride + r] = i2s_finish((S), act + (t) * st, a.w_scale)

#if LB_TN_ISA == 1
        if constexpr (NT == 1) {
            // GEMV (Y4): A (codes, planes 1 and 3) and B (4 x codes, planes 0 and 2) in int16,
            // folded every G <= I2S_GEMV_FOLD_N blocks (FOLD = 1: every block) and at the row's tail.
            // Groups of G blocks, G even (within the fold bound), run unrolled: no loop branch
            // inside a group, and the prefetch at blocks b0 and b0 + 2 (b0 is even) without a
            // test. The last nb % G blocks form a shorter group. (The integer sums are exact: the
            // grouping does not change them.)
            constexpr int G = FOLD == 1 ? 1 : I2S_GEMV_FOLD_N & ~1;
            static_assert(FOLD == 1 || (G % 2 == 0 && G <= I2S_GEMV_FOLD_N), "GEMV groups: even, within the bound");
            const Consts *const k = kc<false>();
            VY u = zy(), A, B;
            auto step = [&](int64_t b) __attribute__((always_inline)) {
                const uint8_t *const q = qlo + (size_t)b * QK_I2S;
                const Y4 c = src.y4(b, k);
                A = pin(_mm256_add_epi16(A, _mm256_add_epi16(_mm256_maddubs_epi16(c.c1, ldy(q + 32)),
                                                             _mm256_maddubs_epi16(c.c3, ldy(q + 96)))));
                B = pin(_mm256_add_epi16(B, _mm256_add_epi16(_mm256_maddubs_epi16(c.c0x4, ldy(q)),
                                                             _mm256_maddubs_epi16(c.c2x4, ldy(q + 64)))));
            };
            auto fold = [&]() __attribute__((always_inline)) {
                u = _mm256_add_epi32(u, _mm256_madd_epi16(_mm256_add_epi16(A, _mm256_srai_epi16(B, 2)), cy(k->one16)));
            };
            int64_t b0 = 0;
            for (; b0 + G <= nb; b0 += G) {
                A = zy(), B = zy();
#pragma GCC unroll 8
                for (int j = 0; j < G; ++j) {
                    if (G % 2 ? !((b0 + j) & 1) : j % 2 == 0) src.prefetch(b0 + j);  // (G = 1: FOLD = 1)
                    step(b0 + j);
                }
                fold();
            }
            if (b0 < nb) {
                A = zy(), B = zy();
                for (int64_t b = b0; b < nb; ++b) {
                    if (!(b & 1)) src.prefetch(b);
                    step(b);
                }
                fold();
            }
            LB_PUT(0, hsum8_i32(u));
        } else {
        // s_t: int16 partials of the current fold group; u_t (NT <= 4) or u8 (NT > 4, lane t =
        // token t, packed by pack8) the int32 sums.
#define LB_DECL(t) [[maybe_unused]] VY s##t = zy(); [[maybe_unused]] VY u##t = zy();
        LB_TN_EACH(LB_DECL)
#undef LB_DECL
        [[maybe_unused]] VY u8 = zy();
        LB_I2S_BLOCK_Y
        for (int64_t b0 = 0; b0 < nb; b0 += FOLD) {
            const int64_t b1 = b0 + FOLD < nb ? b0 + FOLD : nb;
#define LB_ZERO(t) if constexpr (NT > t) s##t = zy();
            LB_TN_EACH(LB_ZERO)
#undef LB_ZERO
            for (int64_t b = b0; b < b1; ++b) block(b);
            // Fold (at every FOLD boundary and at the row's tail): widen the int16 partials.
            if constexpr (NT <= 4) {
                const Consts *const k = kc<kI2sLaunder<NT>>();
#define LB_FOLD(t) if constexpr (NT > t) u##t = _mm256_add_epi32(u##t, _mm256_madd_epi16(s##t, cy(k->one16)));
                LB_TN_EACH(LB_FOLD)
#undef LB_FOLD
            } else {
                const VY one = cy(kc<kI2sLaunder<NT>>()->one16);
                u8 = _mm256_add_epi32(u8, pack8<NT>(_mm256_madd_epi16(s0, one), _mm256_madd_epi16(s1, one),
                                                    _mm256_madd_epi16(s2, one), _mm256_madd_epi16(s3, one),
                                                    _mm256_madd_epi16(s4, one), _mm256_madd_epi16(s5, one),
                                                    _mm256_madd_epi16(s6, one), _mm256_madd_epi16(s7, one)));
            }
        }
        if constexpr (NT <= 4) {
#define LB_SUM(t) if constexpr (NT > t) LB_PUT(t, hsum8_i32(u##t));
            LB_TN_EACH(LB_SUM)
#undef LB_SUM
        } else {
            const __m128i xa = _mm256_castsi256_si128(u8), xb = _mm256_extracti128_si256(u8, 1);
#define LB_SUM(t) if constexpr (NT > t) LB_PUT(t, _mm_extract_epi32((t) < 4 ? xa : xb, (t) & 3));
            LB_TN_EACH(LB_SUM)
#undef LB_SUM
        }
        }  // NT > 1
#else   // vnni levels: dpbusd straight into int32, nothing to defer
        static_assert(FOLD == 0, "the fold is an avx2 (no VNNI) matter");
#if LB_TN_ISA == 3
        // Block's 32 code bytes in both halves of a zmm: cA = [plane 0 | plane 1] meets
        // q[0..63], cB = [plane 2 | plane 3] meets q[64..127].
#define LB_DECL(t) [[maybe_unused]] VZ s##t = zz();
        LB_TN_EACH(LB_DECL)
#undef LB_DECL
        for (int64_t b = 0; b < nb; ++b) {
            const size_t qo = (size_t)b * QK_I2S;
            if (!(b & 1)) src.prefetch(b);
            const auto [cA, cB] = src.z(b, kc<kI2sLaunder<NT>>());
#define LB_STEP(t) \
    if constexpr (NT > t) s##t = pin(kI2sChain<NT> ? dot2z_chain(s##t, cA, LB_TQ(t, qo), cB, LB_TQ(t, qo + 64)) \
                                                 : dot2z_tree(s##t, cA, LB_TQ(t, qo), cB, LB_TQ(t, qo + 64)));
            LB_TN_EACH(LB_STEP)
#undef LB_STEP
        }
#define LB_Y(t) [[maybe_unused]] const VY y##t = NT > t ? fold512(s##t) : zy();
        LB_TN_EACH(LB_Y)
#undef LB_Y
        LB_I2S_SUMS(y)
#else
#define LB_DECL(t) [[maybe_unused]] VY s##t = zy();
        LB_TN_EACH(LB_DECL)
#undef LB_DECL
        LB_I2S_BLOCK_Y
        for (int64_t b = 0; b < nb; ++b) block(b);
        LB_I2S_SUMS(s)
#endif
#endif
#undef LB_PUT
    }
#undef LB_TQ
}

// Row kernel: rows [r0, r1) of the window (tokens t0 .. t0 + NT - 1), each decoded in place.
template <int NT, int FOLD>
void i2s_rows(const RowArgs &a, int64_t r0, int64_t r1, size_t t0 = 0) {
    for (int64_t r = r0; r < r1; ++r) i2s_row<NT, FOLD>(I2sPacked{a.w + (size_t)r * a.w_stride}, a, r, t0);
}

// ---- GEMM: a whole prompt chunk (any nt) over rows [r0, r1) ----------------------------------
// Rows are taken a few at a time (a tile of R rows whose decoded codes, n bytes per row, fill
// kI2sGemmScratch): the tile's codes are decoded once into an L1 scratch (I2sPlanes) and every
// 8-token window of the chunk then runs the shared body i2s_row on them. The decode (per block
// and row: avx2 2 loads, 3 shifts, 4 ands; avx512 a broadcast, 2 srlv, 2 ands) is paid once per
// row per chunk instead of once per row per window, and the window's inner loop only loads
// code vectors. Windows are cut as in run_rows (tokens 8w .. 8w+7), the tokens' sums are exact
// integers and the finish is the body's: the output is bitwise the row kernels' (I2), and a
// row's result does not depend on the tile it fell in (I3).
// Scratch: 16 KB of codes plus one window's activations (8 x n bytes, 20 KB at n = 2560) stay
// in a 48 KB L1d; the chunk's other windows come from L2, once per tile.
constexpr int64_t kI2sGemmScratch = 16384;
// run_rows takes the GEMM for chunks of at least this many tokens; 0: never by itself. Measured
// on the Sapphire Rapids of BENCHMARKS.md ("I2_S GEMM"), the GEMM does not beat the 8-token
// windows at nt 16, 32 or 64 on any level (avx2 0.93-1.03x, avx512 0.77-0.94x): the in-register
// decode is already hidden behind the maddubs / dpbusd ports, and loading decoded codes costs as
// much as decoding them. So it is off by default (at avx512, csrc/x86/gemm.inl's GEMM with
// tokens in lanes replaces it and is on from 16 tokens); LOWBIT_I2S_GEMM_MIN_NT=N (read once, at
// registration) turns it on for chunks of >= N tokens, for A/B runs on other CPUs.
constexpr int kI2sGemmMinNt = 0;

template <int NT, int FOLD>
__attribute__((noinline)) void i2s_gemm_rows(const RowArgs &a, size_t t0, const uint8_t *codes, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
        i2s_row<NT, FOLD>(I2sPlanes{codes + (size_t)(r - r0) * (size_t)a.n}, a, r, t0);
}

// Rows [rb, re) decoded into the scratch. Not inlined: its mask constants would otherwise be
// hoisted into i2s_gemm's loop and saved to the stack around each window call (clang, I7).
__attribute__((noinline)) void i2s_decode_tile(const RowArgs &a, uint8_t *codes, int64_t nb, int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r)
        i2s_decode_planes(a.w + (size_t)r * a.w_stride, codes + (size_t)(r - rb) * (size_t)a.n, nb);
}

template <int FOLD>
void i2s_gemm(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    using WinFn = void (*)(const RowArgs &, size_t, const uint8_t *, int64_t, int64_t);
    static constexpr WinFn win[MAX_NT + 1] = {nullptr, &i2s_gemm_rows<1, FOLD>, &i2s_gemm_rows<2, FOLD>,
                                              &i2s_gemm_rows<3, FOLD>, &i2s_gemm_rows<4, FOLD>, &i2s_gemm_rows<5, FOLD>,
                                              &i2s_gemm_rows<6, FOLD>, &i2s_gemm_rows<7, FOLD>, &i2s_gemm_rows<8, FOLD>};
    // The scratch is per thread and off the stack (tools/check_spills.py counts stack vector
    // moves in every "gemm" function).
    alignas(64) static thread_local uint8_t scratch[kI2sGemmScratch];
    // Its address is taken once: through the opaque copy, clang cannot re-derive it (a TLS
    // call) inside i2s_decode_tile's row loop, where the call would save its vectors (I7).
    uint8_t *codes = scratch;
    __asm__("" : "+r"(codes));
    const int64_t nb = a.n / QK_I2S;
    // a row's codes must fit the scratch: 16384 weights per row (wider rows: several passes
    // would be needed; run_rows' row kernels serve them, see i2s_gemm_entry)
    const int64_t R = kI2sGemmScratch / a.n;
    for (int64_t rb = r0; rb < r1; rb += R) {
        const int64_t re = rb + R < r1 ? rb + R : r1;
        i2s_decode_tile(a, codes, nb, rb, re);
        for (int t0 = 0; t0 < nt; t0 += MAX_NT) win[nt - t0 < MAX_NT ? nt - t0 : MAX_NT](a, (size_t)t0, codes, rb, re);
    }
}

// ============================================================================================
// TQ2_0 / TQ1_0 x Q8_K
// ============================================================================================
// Q8_K block (292 bytes): float d, int8 qs[256], int16 bsums[16] (sums of 16 qs each).
// Per block b and token:
//   S_b  = sum_k code_k * q_k - sum(bsums) = sum_k (code_k - 1) * q_k      (exact int32)
//   sumf = sumf + (float)S_b * (d_act * d_w)        (the reference's order; 4 tokens per xmm)
// Per-block integer partials s_t restart at 0 every block: avx2 int16 (at most 8 maddubs
// terms of |.| <= 768 per lane, minus a bsum of |.| <= 16 * 128: < 8200), vnni int32.
constexpr size_t Q8K_BYTES = sizeof(block_q8_K);
constexpr size_t Q8K_QS = offsetof(block_q8_K, qs), Q8K_BSUMS = offsetof(block_q8_K, bsums);
static_assert(offsetof(block_q8_K, d) == 0 && Q8K_QS == 4 && Q8K_BSUMS == 260, "q8_K layout");

// d_act of tokens 0..K-1 (their Q8_K blocks at p + t * st); lanes >= K are never read.
template <int K>
LB_TN_INLINE __m128 dact4(const uint8_t *p, size_t st) {
    const __m128 d0 = _mm_load_ss((const float *)p);
    if constexpr (K == 1) return d0;
    const __m128 d01 = _mm_unpacklo_ps(d0, _mm_load_ss((const float *)(p + st)));
    if constexpr (K == 2) return d01;
    const __m128 d2 = _mm_load_ss((const float *)(p + 2 * st));
    if constexpr (K == 3) return _mm_movelh_ps(d01, d2);
    return _mm_movelh_ps(d01, _mm_unpacklo_ps(d2, _mm_load_ss((const float *)(p + 3 * st))));
}

// d_act of tokens 0..K-1 in lane t (K = 5..8).
template <int K>
LB_TN_INLINE __m256 dact8(const uint8_t *p, size_t st) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(dact4<4>(p, st)), dact4<K - 4>(p + 4 * st, st), 1);
}

// 8 int32 lanes whose total is S_b: the per-block partials minus the token's bsums.
#if LB_TN_ISA == 1
LB_TN_INLINE VY tq_offset(VY s16, const uint8_t *bsums, const Consts *k) {
    return _mm256_madd_epi16(_mm256_sub_epi16(s16, ldy(bsums)), cy(k->one16));
}
#else
LB_TN_INLINE VY tq_offset(VY s32, const uint8_t *bsums, const Consts *k) {
    return _mm256_sub_epi32(s32, _mm256_madd_epi16(ldy(bsums), cy(k->one16)));
}
#endif

// Per-token step: the block's partials restart at 0 every block, so consecutive blocks'
// chains overlap and the direct chain costs nothing. (TQ runs on 32-byte vectors at every
// level: on avx512 the 512-bit form measured no faster, its shifts and dpbusd sharing ports.)
LB_TN_INLINE VY tq_step(VY acc, VY ca, const void *qa, VY cb, const void *qb) {
    return dot2_chain(acc, ca, qa, cb, qb);
}

// ---- TQ2_0: qs[32h + m] bits 2l..2l+1 = code of weight 128h + 32l + m ----------------------
struct Tq2 {
    using Block = block_tq2_0;
    static constexpr bool kLaunder = false;
#if LB_TN_ISA == 3
    // avx512, windows of 2..8 tokens (tq_rows' kZ path): bits 2l of all 64 bytes in one zmm,
    // lanes [code of 32l + m | code of 128 + 32l + m], against the token's quants re-laid out
    // in that order (tq_relayout): half the dpbusd of the ymm form. Zen 5: 1.87x -> see
    // BENCHMARKS.md (issue 17).
    static constexpr bool kZmm = true;
    template <class Step>
    static LB_TN_INLINE void run_z(const Block &x, Step &&step) {
        const VZ raw = ldz(x.qs), m3 = _mm512_set1_epi8(3);
        step(_mm512_and_si512(raw, m3), 0);
        step(_mm512_and_si512(_mm512_srli_epi16(raw, 2), m3), 64);
        step(_mm512_and_si512(_mm512_srli_epi16(raw, 4), m3), 128);
        step(_mm512_and_si512(_mm512_srli_epi16(raw, 6), m3), 192);
    }
#else
    static constexpr bool kZmm = false;
#endif
#if LB_TN_ISA == 1
    // avx2, one token (tq_rows' GEMV): the block's 8 int32 lanes whose total is S_b, with one
    // shift per 32 code bytes instead of three. Planes 1 and 3 stay in place, as 4 x code
    // (& 0x0C), and their products go to a second int16 sum Q, a multiple of 4 lane by lane,
    // so Q >> 2 is exact: S16 = P + (Q >> 2) - bsums. Bounds per lane (|q| <= 128): P <= 4 *
    // 768, Q <= 4 * 4 * 768 = 12288, |S16| <= 2 * 3072 + 2048: int16, exact.
    static constexpr bool kGemv = true;
    static LB_TN_INLINE VY gemv_block(const Block &x, const uint8_t *qs, const uint8_t *bsums, const Consts *k) {
        VY P[2], Q[2];  // per 32 code bytes h
        for (int h = 0; h < 2; ++h) {
            const VY raw = ldy(x.qs + 32 * h), t = _mm256_srli_epi16(raw, 4);
            const uint8_t *const q = qs + 128 * h;
            P[h] = pin(_mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(raw, cy(k->m3)), ldy(q)),
                                        _mm256_maddubs_epi16(_mm256_and_si256(t, cy(k->m3)), ldy(q + 64))));
            Q[h] = pin(_mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(raw, cy(k->m12)), ldy(q + 32)),
                                        _mm256_maddubs_epi16(_mm256_and_si256(t, cy(k->m12)), ldy(q + 96))));
        }
        const VY p = _mm256_add_epi16(P[0], P[1]), qq = _mm256_add_epi16(Q[0], Q[1]);
        return tq_offset(_mm256_add_epi16(p, _mm256_srai_epi16(qq, 2)), bsums, k);
    }
#else
    static constexpr bool kGemv = false;
#endif
    template <bool L, bool CARRY, class Step>
    static LB_TN_INLINE void run(const Block &x, Step &&step) {
        for (int h = 0; h < 2; ++h) {
            {
                const Consts *const k = kc<L>();
                const VY raw = ldy(x.qs + 32 * h);
                step(_mm256_and_si256(raw, cy(k->m3)), 128 * h,
                     _mm256_and_si256(_mm256_srli_epi16(raw, 2), cy(k->m3)), 128 * h + 32);
            }
            {
                const Consts *const k = kc<L>();
                const VY raw = ldy(x.qs + 32 * h);
                step(_mm256_and_si256(_mm256_srli_epi16(raw, 4), cy(k->m3)), 128 * h + 64,
                     _mm256_and_si256(_mm256_srli_epi16(raw, 6), cy(k->m3)), 128 * h + 96);
            }
        }
    }
};

// ---- TQ1_0: base-3 digits ------------------------------------------------------------------
// Trit k of byte b is floor(3 x / 256) with x = (uint8)(b * 3^k), i.e. (x >= 86) + (x >= 171).
// The bytes are kept biased, xs = x ^ 0x80 = x + 128 (mod 256), so both tests are signed
// compares; the bias survives the multiplications by 3^k since 128 * odd = 128 (mod 256).
// Layout (csrc/ref/ternary.cpp): qs[0..31] trits 0..4 -> q[32k .. 32k+31]; qs[32..47] trits
// 0..4 -> q[160 + 16k .. +15]; qh[0..3] trits 0..3 -> q[240 + 4k .. +3].
// clang folds v + v + v into a byte multiply by 3, which x86 lacks: it emulates it with two
// pmullw, two masks and a pack, and holds the masks in registers (spills, I7). The empty asm
// hides that 2v is v + v; GCC keeps the adds either way.
LB_TN_INLINE VY x3(VY v) {
    VY v2 = _mm256_add_epi8(v, v);
#if defined(__clang__)
    __asm__("" : "+x"(v2));
#endif
    return _mm256_add_epi8(v, v2);
}
LB_TN_INLINE VY x9(VY v) { return x3(x3(v)); }  // adds only: no constant to hold
// 0, 1, 2 as unsigned bytes: each compare is 0 or -1, so |sum| counts the thresholds passed.
LB_TN_INLINE VY trit(VY xs, const Consts *k) {
    return _mm256_abs_epi8(_mm256_add_epi8(_mm256_cmpgt_epi8(xs, cy(k->k86)), _mm256_cmpgt_epi8(xs, cy(k->k171))));
}

struct Tq1 {
    using Block = block_tq1_0;
    static constexpr bool kLaunder = true;
    static constexpr bool kZmm = false;
    static constexpr bool kGemv = false;  // (no gemv_block: tq_rows' GEMV runs `run`)
    // CARRY (few tokens): one base-3 chain per source, kept in a register from phase to phase.
    // Otherwise (5..8 tokens on 16 ymm) each phase re-derives its bytes from memory, and the
    // heaviest decode runs first, while the token accumulators are still zero. Both give the
    // same codes; the order of exact integer sums is free.
    template <bool L, bool CARRY, class Step>
    static LB_TN_INLINE void run(const Block &x, Step &&step) {
        const __m128i *const pb = (const __m128i *)(x.qs + 32);
        if constexpr (CARRY) {
            const Consts *const k = kc<L>();
            const VY a0 = _mm256_xor_si256(ldy(x.qs), cy(k->bias)), a1 = x3(a0);
            step(trit(a0, k), 0, trit(a1, k), 32);
            const VY a2 = x3(a1), a3 = x3(a2);
            step(trit(a2, k), 64, trit(a3, k), 96);
            const VY b = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128(pb)), cy(k->bias));
            const VY b1 = _mm256_blend_epi32(b, x3(b), 0xF0);  // [B | 3B]
            step(trit(x3(a3), k), 128, trit(b1, k), 160);
            const VY b9 = x9(b1);                               // [9B | 27B]
            step(trit(b9, k), 192, trit(tq1_last(x9(b9), x, k), k), 224);
        } else {
            {   // [9B | 27B] -> q[192..223]; [81B | qh products] -> q[224..255]
                const Consts *const k = kc<L>();
                const VY b = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128(pb)), cy(k->bias));
                const VY b9 = x9(_mm256_blend_epi32(b, x3(b), 0xF0));
                step(trit(b9, k), 192, trit(tq1_last(x9(b9), x, k), k), 224);
            }
            {   // qs[0..31] * 81 -> q[128..159]; [B | 3B], B = qs[32..47] -> q[160..191]
                const Consts *const k = kc<L>();
                const VY a = x9(x9(_mm256_xor_si256(ldy(x.qs), cy(k->bias))));
                const VY b = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128(pb)), cy(k->bias));
                step(trit(a, k), 128, trit(_mm256_blend_epi32(b, x3(b), 0xF0), k), 160);
            }
            {   // qs[0..31] * 1, 3 -> q[0..63]
                const Consts *const k = kc<L>();
                const VY a = _mm256_xor_si256(ldy(x.qs), cy(k->bias));
                step(trit(a, k), 0, trit(x3(a), k), 32);
            }
            {   // qs[0..31] * 9, 27 -> q[64..127]
                const Consts *const k = kc<L>();
                const VY a = x9(_mm256_xor_si256(ldy(x.qs), cy(k->bias)));
                step(trit(a, k), 64, trit(x3(a), k), 96);
            }
        }
    }
    // [81B (low half, given) | qh * 1, 3, 9, 27, one dword each (biased)] -> q[224..255]. The qh
    // products come from 16-bit multiplies: the low byte of a word product is exact, and so is
    // the high byte when the operand's low byte is cleared.
    static LB_TN_INLINE VY tq1_last(VY b81, const Block &x, const Consts *k) {
        uint32_t qh;
        std::memcpy(&qh, x.qh, 4);
        const VY h = _mm256_xor_si256(_mm256_set1_epi32((int)qh), cy(k->bias));
        const VY lo = _mm256_and_si256(_mm256_mullo_epi16(h, cy(k->qh_pow)), cy(k->lo8));
        const VY hi = _mm256_mullo_epi16(_mm256_and_si256(h, cy(k->hi8)), cy(k->qh_pow));
        return _mm256_blend_epi32(b81, _mm256_or_si256(lo, hi), 0xF0);
    }
};

#if LB_TN_ISA == 3
// The window's Q8_K blocks copied once per call (amortised over the call's rows) with each
// block's 256 quants in the order of Tq2::run_z's lanes: plane l at bytes 64l..64l+63 =
// [q[32l..32l+31] | q[128+32l..128+32l+31]]; d and bsums where they were. Returns the copy;
// token t's blocks at t * nb * Q8K_BYTES.
inline const uint8_t *tq_relayout(const RowArgs &a, int nt, int64_t nb) {
    static thread_local std::vector<uint8_t> buf;
    const size_t per = (size_t)nb * Q8K_BYTES;
    if (buf.size() < (size_t)nt * per) buf.resize((size_t)nt * per);
    for (int t = 0; t < nt; ++t)
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t *src = a.act + (size_t)t * a.act_stride + (size_t)b * Q8K_BYTES;
            uint8_t *dst = buf.data() + (size_t)t * per + (size_t)b * Q8K_BYTES;
            std::memcpy(dst, src, Q8K_BYTES);
            for (int l = 0; l < 4; ++l) {
                std::memcpy(dst + Q8K_QS + 64 * l, src + Q8K_QS + 32 * l, 32);
                std::memcpy(dst + Q8K_QS + 64 * l + 32, src + Q8K_QS + 128 + 32 * l, 32);
            }
        }
    return buf.data();
}
#endif

// The one-token form's copy of its Q8_K blocks (once per call, amortised over the call's rows):
// block b's qs then bsums at 288 b of a 64-aligned buffer (288 = 9 x 32: no 32-byte load
// crosses a cache line; Q8_K's 292-byte blocks put qs at 4 mod 32), then the blocks' d as one
// float array at 288 nb (tq_gv_d: four blocks' d_act in one load).
constexpr size_t kGvBytes = 288, kGvQs = 0, kGvBsums = 256;
inline const float *tq_gv_d(const uint8_t *gv, int64_t nb) {
    return reinterpret_cast<const float *>(gv + (size_t)nb * kGvBytes);
}
inline const uint8_t *tq_gemv_relayout(const uint8_t *act, int64_t nb) {
    struct alignas(64) Line { uint8_t b[64]; };
    static thread_local std::vector<Line> buf;
    const size_t lines = ((size_t)nb * (kGvBytes + 4) + 63) / 64;
    if (buf.size() < lines) buf.resize(lines);
    uint8_t *const dst = reinterpret_cast<uint8_t *>(buf.data());
    float *const d = reinterpret_cast<float *>(dst + (size_t)nb * kGvBytes);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *src = act + (size_t)b * Q8K_BYTES;
        std::memcpy(dst + (size_t)b * kGvBytes + kGvQs, src + Q8K_QS, 256);
        std::memcpy(dst + (size_t)b * kGvBytes + kGvBsums, src + Q8K_BSUMS, 32);
        std::memcpy(d + b, src, 4);
    }
    return dst;
}

template <int NT, class Dec>
void tq_rows(const RowArgs &a, int64_t r0, int64_t r1) {
    using Block = typename Dec::Block;
    const int64_t nb = a.n / QK_K;
    // kZ: the zmm form (Tq2 at avx512, 2..8 tokens) reads the re-laid-out copy of the window's
    // activations; the exact block integers are the same, so the results are too (I2).
    constexpr bool kZ = Dec::kZmm && NT >= 2;
    const uint8_t *act = a.act;
    size_t st = a.act_stride;
#if LB_TN_ISA == 3
    if constexpr (kZ) act = tq_relayout(a, NT, nb), st = (size_t)nb * Q8K_BYTES;
#endif
    const uint8_t *const alo = act;           // tokens 0..3: alo + t * st
    const uint8_t *const ahi = act + 4 * st;  // tokens 4..7
#define LB_TA(t, off) (((t) < 4 ? alo : ahi) + ((t) & 3) * st + (off))
    [[maybe_unused]] const uint8_t *gv = nullptr;  // NT = 1: tq_gemv_relayout's copy
    [[maybe_unused]] const float *gvd = nullptr;  // its d_act array
    if constexpr (NT == 1) {
        if (r1 > r0) gv = tq_gemv_relayout(alo, nb), gvd = tq_gv_d(gv, nb);
    }
    for (int64_t r = r0; r < r1; ++r) {
        const Block *const x = reinterpret_cast<const Block *>(a.w + (size_t)r * a.w_stride);
        [[maybe_unused]] __m128 f4 = _mm_setzero_ps();     // sumf of token t in lane t (NT <= 4)
        [[maybe_unused]] __m256 f8 = _mm256_setzero_ps();  // (NT > 4)
        int64_t i = 0;
        if constexpr (NT == 1) {
            // GEMV: two blocks per step. Their exact sums are reduced together (lanes 0 and 2)
            // and their two products (float)S * (d_act * d_w) formed in one vector op; the two
            // adds into sumf stay sequential, in block order: the same float steps as below.
            auto block_sum = [&](int64_t b) __attribute__((always_inline)) {
                prefetch_ahead(&x[b], sizeof(Block));
                const uint8_t *const y = gv + (size_t)b * kGvBytes;
                if constexpr (Dec::kGemv) return pin(Dec::gemv_block(x[b], y + kGvQs, y + kGvBsums, kc<Dec::kLaunder>()));
                VY s = zy();
                Dec::template run<Dec::kLaunder, (NT <= 4)>(x[b], [&](VY ca, size_t oa, VY cb, size_t ob) __attribute__((always_inline)) {
                    s = pin(tq_step(s, ca, y + kGvQs + oa, cb, y + kGvQs + ob));
                });
                return pin(tq_offset(s, y + kGvBsums, kc<Dec::kLaunder>()));
            };
            // Four blocks per step where the row has them: one pack4 (3 hadds, the halves) for
            // the four exact sums, one product vector, then the four adds in block order.
            const auto dw4 = [&](int64_t b) __attribute__((always_inline)) {  // d_w of blocks b..b+3, via a GPR
                const uint64_t h = (uint64_t)x[b].d | (uint64_t)x[b + 1].d << 16 | (uint64_t)x[b + 2].d << 32 |
                                   (uint64_t)x[b + 3].d << 48;
                return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)h));
            };
            for (; i + 4 <= nb; i += 4) {
                const VY ma = block_sum(i), mb = block_sum(i + 1), mc = block_sum(i + 2), md = block_sum(i + 3);
                const __m128i x4 = pack4<4>(ma, mb, mc, md);  // lane j = S of block i + j
                const __m128 da4 = _mm_loadu_ps(gvd + i);
                const __m128 p = _mm_mul_ps(_mm_cvtepi32_ps(x4), _mm_mul_ps(da4, dw4(i)));
                f4 = _mm_add_ss(f4, p);
                f4 = _mm_add_ss(f4, _mm_movehdup_ps(p));
                f4 = _mm_add_ss(f4, _mm_movehl_ps(p, p));
                f4 = _mm_add_ss(f4, _mm_shuffle_ps(p, p, 3));
            }
            for (; i + 2 <= nb; i += 2) {
                const VY ma = block_sum(i), mb = block_sum(i + 1);
                const VY h = _mm256_hadd_epi32(ma, mb);  // [a01 a23 b01 b23 | a45 a67 b45 b67]
                __m128i x2 = halves(h);
                x2 = _mm_add_epi32(x2, _mm_shuffle_epi32(x2, 0xB1));  // lane 0 = S_a, lane 2 = S_b
                const __m128 dw2 = _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(x[i].d), x[i + 1].d, 2));
                const __m128 da2 = _mm_insert_ps(_mm_load_ss(gvd + i), _mm_load_ss(gvd + i + 1), 0x20);  // lanes 0, 2: x2's
                const __m128 p = _mm_mul_ps(_mm_cvtepi32_ps(x2), _mm_mul_ps(da2, dw2));
                f4 = _mm_add_ss(f4, p);
                f4 = _mm_add_ss(f4, _mm_movehl_ps(p, p));
            }
        }
        for (; i < nb; ++i) {
            prefetch_ahead(&x[i], sizeof(Block));
            const size_t yo = (size_t)i * Q8K_BYTES;
#define LB_DECL(t) [[maybe_unused]] VY s##t = zy();
            LB_TN_EACH(LB_DECL)
#undef LB_DECL
            if constexpr (kZ) {
#if LB_TN_ISA == 3
#define LB_DECLZ(t) [[maybe_unused]] VZ z##t = zz();
                LB_TN_EACH(LB_DECLZ)
#undef LB_DECLZ
                Dec::run_z(x[i], [&](VZ c, size_t o) __attribute__((always_inline)) {
#define LB_STEPZ(t) if constexpr (NT > t) z##t = dpbz(z##t, c, ldz(LB_TA(t, yo + Q8K_QS + o)));
                    LB_TN_EACH(LB_STEPZ)
#undef LB_STEPZ
                });
#define LB_FOLDZ(t) \
    if constexpr (NT > t) s##t = pin(_mm256_add_epi32(_mm512_castsi512_si256(z##t), _mm512_extracti64x4_epi64(z##t, 1)));
                LB_TN_EACH(LB_FOLDZ)
#undef LB_FOLDZ
#endif
            } else {
                Dec::template run<Dec::kLaunder, (NT <= 4)>(x[i], [&](VY ca, size_t oa, VY cb, size_t ob) __attribute__((always_inline)) {
#define LB_STEP(t) \
    if constexpr (NT > t) s##t = pin(tq_step(s##t, ca, LB_TA(t, yo + Q8K_QS + oa), cb, LB_TA(t, yo + Q8K_QS + ob)));
                    LB_TN_EACH(LB_STEP)
#undef LB_STEP
                });
            }
            // End of the block: f = f + (float)S * (d_act * d_w), lane t = token t (xmm for
            // NT <= 4, ymm for 5..8: the same IEEE op per lane either way).
            const float dw = _cvtsh_ss(x[i].d);
            const Consts *const k = kc<Dec::kLaunder>();
#define LB_M(t) [[maybe_unused]] VY m##t = zy(); if constexpr (NT > t) m##t = pin(tq_offset(s##t, LB_TA(t, yo + Q8K_BSUMS), k));
            LB_TN_EACH(LB_M)
#undef LB_M
            if constexpr (NT <= 4) {
                const __m128 d = _mm_mul_ps(dact4<NT>(LB_TA(0, yo), st), _mm_set1_ps(dw));
                f4 = _mm_add_ps(f4, _mm_mul_ps(_mm_cvtepi32_ps(pack4<NT>(m0, m1, m2, m3)), d));
            } else {
                const __m256 d = _mm256_mul_ps(dact8<NT>(LB_TA(0, yo), st), _mm256_set1_ps(dw));
                f8 = _mm256_add_ps(f8, _mm256_mul_ps(_mm256_cvtepi32_ps(pack8<NT>(m0, m1, m2, m3, m4, m5, m6, m7)), d));
            }
        }
        float *const o = a.out + r;
        const size_t os = a.out_stride;
        [[maybe_unused]] __m128 fA = f4, fB = f4;
        if constexpr (NT > 4) fA = _mm256_castps256_ps128(f8), fB = _mm256_extractf128_ps(f8, 1);
#define LB_OUT(t) if constexpr (NT > t) store_lane<(t) & 3>(o + (t) * os, (t) < 4 ? fA : fB);
        LB_TN_EACH(LB_OUT)
#undef LB_OUT
    }
#undef LB_TA
}

// ---- registration ----------------------------------------------------------------------------
#define LB_TN_STR2(x) #x
#define LB_TN_STR(x) LB_TN_STR2(x)
#define LB_TN_LEVEL LB_TN_STR(LOWBIT_NS)

template <int FOLD>
struct I2sK {
    template <int NT>
    static void rows(const RowArgs &a, int64_t r0, int64_t r1, int) { i2s_rows<NT, FOLD>(a, r0, r1); }
};
// The GEMM entry (KernelEntry::gemm), one call for a row tile's whole chunk. Rows wider than the
// scratch (n > 16384) run as the row kernels' windows: the same results.
template <int FOLD>
void i2s_gemm_entry(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    if (a.n <= kI2sGemmScratch) return i2s_gemm<FOLD>(a, r0, r1, nt);
    using RowFn = void (*)(const RowArgs &, int64_t, int64_t, size_t);
    static constexpr RowFn row[MAX_NT + 1] = {nullptr, &i2s_rows<1, FOLD>, &i2s_rows<2, FOLD>, &i2s_rows<3, FOLD>,
                                              &i2s_rows<4, FOLD>, &i2s_rows<5, FOLD>, &i2s_rows<6, FOLD>,
                                              &i2s_rows<7, FOLD>, &i2s_rows<8, FOLD>};
    for (int t0 = 0; t0 < nt; t0 += MAX_NT) row[nt - t0 < MAX_NT ? nt - t0 : MAX_NT](a, r0, r1, (size_t)t0);
}
template <class Dec>
struct TqK {
    template <int NT>
    static void rows(const RowArgs &a, int64_t r0, int64_t r1, int) { tq_rows<NT, Dec>(a, r0, r1); }
};
// One template instance per window size: the table dispatches nt once per call. (The entry
// points are named `rows` so that tools/check_spills.py sees them as row kernels even when
// the body is inlined into them.)
template <class K, int... NT>
void set_rows(KernelTable &t, int id, const char *name, std::integer_sequence<int, NT...>) {
    ((t.at(id).rows[NT + 1] = RowKernel{&K::template rows<NT + 1>, name, LOWBIT_ISA}), ...);
}

}  // namespace

void register_ternary(KernelTable &t) {
    const auto all = std::make_integer_sequence<int, MAX_NT>{};
#if LB_TN_ISA == 1
    // LOWBIT_I2S_FOLD=1: widen every block (bitnet.cpp's schedule), for A/B runs. Read once
    // here, never in the kernels; the variant has its own name in `lowbit info` and stats(),
    // for the row kernels and the GEMM alike (they share the body, so they share the schedule).
    const char *f = std::getenv("LOWBIT_I2S_FOLD");
    const bool fold1 = f && *f && std::strcmp(f, "0") != 0;
    if (fold1) {
        set_rows<I2sK<1>>(t, T_I2_S, "rows_i2_s_i8_s_" LB_TN_LEVEL "_fold1", all);
        t.at(T_I2_S).gemm = RowKernel{&i2s_gemm_entry<1>, "gemm_i2_s_i8_s_" LB_TN_LEVEL "_fold1", LOWBIT_ISA};
    } else {
        set_rows<I2sK<I2S_FOLD_N>>(t, T_I2_S, "rows_i2_s_i8_s_" LB_TN_LEVEL, all);
        t.at(T_I2_S).gemm = RowKernel{&i2s_gemm_entry<I2S_FOLD_N>, "gemm_i2_s_i8_s_" LB_TN_LEVEL, LOWBIT_ISA};
    }
#else
    set_rows<I2sK<0>>(t, T_I2_S, "rows_i2_s_i8_s_" LB_TN_LEVEL, all);
    t.at(T_I2_S).gemm = RowKernel{&i2s_gemm_entry<0>, "gemm_i2_s_i8_s_" LB_TN_LEVEL, LOWBIT_ISA};
#endif
    const char *g = std::getenv("LOWBIT_I2S_GEMM_MIN_NT");
    t.at(T_I2_S).gemm_min_nt = g && *g ? std::atoi(g) : kI2sGemmMinNt;
    set_rows<TqK<Tq2>>(t, T_TQ2_0, "rows_tq2_0_q8_k_" LB_TN_LEVEL, all);
    set_rows<TqK<Tq1>>(t, T_TQ1_0, "rows_tq1_0_q8_k_" LB_TN_LEVEL, all);
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
