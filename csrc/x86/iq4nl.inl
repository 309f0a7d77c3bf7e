// IQ4_NL x Q8_0 for the legacy engine (csrc/x86/legacy.inl includes this file inside its
// namespace, before the kernels; the arithmetic, strategies and bounds are described there).
// A block is Q4_0-like: 32 nibbles (low nibble of qs[j] = weight j, high = weight j + 16) and an
// fp16 d, but a nibble indexes the non-linear table kvalues_iq4nl (csrc/ref/iq_tables.h), whose
// values lie in [-127, 113]: one pshufb per 32 codes looks them up. The vnni levels look up
// value + 128 (unsigned, offset 128, taken back out exactly as -128 * sum(q_a)); avx2 looks up
// the signed values and uses the sign trick (|w| <= 127: a maddubs pair is at most
// 2 * 127 * 127 = 32258, no saturation).

// value (+ 128 on vnni levels), in both halves
constexpr C32 iq4nl_table() {
    C32 c{};
    for (int i = 0; i < 32; ++i) c.b[i] = (uint8_t)(iq::kvalues_iq4nl[i % 16] + (kVnni ? 128 : 0));
    return c;
}
constexpr C32 kIq4nlTable = iq4nl_table();
LB_LG_INLINE __m256i iq4nl_lut() { return K(kIq4nlTable); }

struct FIQ4_NL {
    static constexpr int kBytes = 18, kQs = 2, kQh = -1, kBits = 4, kOff = kVnni ? 128 : 0, kK16 = 1;
    static constexpr bool kLut = true, kQ8_1 = false, kSign = !kVnni, kM = false;
};
