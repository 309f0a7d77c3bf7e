// MXFP4 x Q8_0 for the legacy engine (csrc/x86/legacy.inl includes this file inside its
// namespace, after iq4nl.inl and before the kernels; the arithmetic, strategies and bounds are
// described there). The spec is csrc/ref/mxfp4.cpp.
//
// A block is IQ4_NL's with another code book and another scale: one byte e (e8m0) at offset 0,
// then the 16 bytes of nibbles (low nibble of qs[j] = weight j, high = weight j + 16), 17 bytes
// in all. A nibble indexes kvalues_mxfp4 (e2m1 doubled, integers in [-12, 12]): one pshufb per 32
// codes looks up value + 12, an unsigned code u in [0, 24] (offset 12, taken back out exactly as
// -12 * sum(q_a) per (token, block), like Q4_0's 8), at every level. avx2's TT chunks take the
// hadd transpose (legacy.inl, tt_hadd): the decoded pair is itself the maddubs operand, no
// per-k broadcast and no int16 partials across k. Bounds (I1): dpbusd lanes are far from 2^31;
// avx2's maddubs pairs are <= 2 * 24 * 127 = 6096, and no int16 lane sums more than 8 products
// (pair16 + hadd16 in tt_hadd and BT, or kK16 = 4 maddubs on the int16-partial path):
// <= 8 * 24 * 127 = 24384 < 32767.
//
// The block's scale enters where an fp16 d would: group_scales reads the byte at each block's
// start (e: 8 byte loads, e8m0_group) and e8m0_half_ps
// turns e into the float 2^(e - 128), bit for bit the reference's e8m0_half (normal for e >= 2,
// the denormals 2^-128 / 2^-127 for e = 0, 1).
// The float step is then the legacy one: S = d_w * d_a, acc = fma((float)isum, S, acc).

// value + 12, in both halves
constexpr C32 mxfp4_table() {
    constexpr int8_t kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};  // = ref::kvalues_mxfp4
    C32 c{};
    for (int i = 0; i < 32; ++i) c.b[i] = (uint8_t)(kv[i % 16] + 12);
    return c;
}
constexpr C32 kMxfp4Table = mxfp4_table();

struct FMXFP4 {
    static constexpr int kBytes = 17, kQs = 1, kQh = -1, kBits = 4, kOff = 12, kK16 = 4;
    static constexpr bool kLut = true, kQ8_1 = false, kSign = false, kM = false;
};

// The 16-entry code book a kLut format's nibbles index (in both 128-bit halves).
template <class F>
LB_LG_INLINE __m256i code_lut() {
    if constexpr (std::is_same_v<F, FMXFP4>) return K(kMxfp4Table);
    else return iq4nl_lut();
}

// Formats whose block scale is an e8m0 byte at the block's start (not an fp16 d).
template <class F>
constexpr bool kE8M0Scale = std::is_same_v<F, FMXFP4>;

constexpr C32 kLowByte32 = rep8(0x000000FF000000FFull), kOne32 = rep8(0x0000000100000001ull);
constexpr C32 kE8M0Den = rep8(0x0020000000200000ull);  // 2^-128 as float bits (e = 0; << 1 for e = 1)

// dword lanes whose low byte is e -> 2^(e - 128) as floats (ref::e8m0_half)
LB_LG_INLINE __m256 e8m0_half_ps(__m256i g) {
    const __m256i e = _mm256_and_si256(g, K(kLowByte32));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, K(kOne32)), 23);
    const __m256i den = _mm256_sllv_epi32(K(kE8M0Den), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(den, normal, _mm256_cmpgt_epi32(e, K(kOne32))));
}

// The e bytes of a group's blocks (B bytes apart), in class order L, as dword lanes, by 8 scalar
// byte loads packed in a GPR (the integer ports idle in these kernels) instead of a ymm gather
// (many vector uops on Zen 3 to Zen 5). TAIL: the row's last n < 8 blocks; the others read 0.
template <int B, bool TAIL = false>
LB_LG_INLINE __m256i e8m0_group(const uint8_t *wg, int n = 8) {
    constexpr int L[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    uint64_t e = 0;
    for (int i = 0; i < 8; ++i)
        if (!TAIL || L[i] < n) e |= (uint64_t)wg[L[i] * B] << (8 * i);
    return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)e));
}
