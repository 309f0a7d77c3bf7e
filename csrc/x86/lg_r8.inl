// What the legacy formats' R8 row kernels of every level share (csrc/x86/{avx2,avx512}/lg_r8.cpp;
// the layout: csrc/repack.h): the formats' constants, the activation record's size and tail, and
// the walk over a group's pairs of blocks by accumulator class. Included inside each level's
// anonymous namespace, so built with that level's flags only.

#define LB_LR_INLINE inline __attribute__((always_inline))

// The formats: kDwords code dwords per block; kQs where a group's codes start; kGroup its bytes;
// kOff the code offset (the unsigned code is q_w + kOff); kM an fp16 m (Q4_1); kAct / kAqs the
// activation block's bytes and where its codes start (Q8_0: d, qs; Q8_1: d, s, qs).
struct LQ4_0 {
    static constexpr int kDwords = 4, kOff = 8, kAct = 34, kAqs = 2;
    static constexpr size_t kQs = 32, kGroup = 16 * 18;
    static constexpr bool kM = false;
};
struct LQ4_1 {
    static constexpr int kDwords = 4, kOff = 0, kAct = 36, kAqs = 4;
    static constexpr size_t kQs = 64, kGroup = 16 * 20;
    static constexpr bool kM = true;
};
struct LQ8_0 {
    static constexpr int kDwords = 8, kOff = 128, kAct = 34, kAqs = 2;
    static constexpr size_t kQs = 32, kGroup = 16 * 34;
    static constexpr bool kM = false;
};

constexpr size_t kRec = 80;  // bytes of a (token, pair) activation record

struct alignas(64) Line { uint8_t b[64]; };

// A record's bytes [64, 80) for activation blocks b0, b1 (2p, 2p + 1): their d_a (float), then
// Q8_1's s_a of both (float), or the offset terms -kOff * sum(q_a) of both (int32; sum(s0, s1)
// gives the blocks' exact code sums)
template <class F, class Sum>
LB_LR_INLINE void record_tail(uint8_t *r, const uint8_t *b0, const uint8_t *b1, const Sum &sum) {
    uint16_t h0[2], h1[2];
    std::memcpy(h0, b0, 4);  // d_a (and Q8_1's s_a): unaligned fp16, read as bytes
    std::memcpy(h1, b1, 4);
    const float d[2] = {fp16_to_f32(h0[0]), fp16_to_f32(h1[0])};
    std::memcpy(r + 64, d, 8);
    if constexpr (F::kM) {
        const float sa[2] = {fp16_to_f32(h0[1]), fp16_to_f32(h1[1])};
        std::memcpy(r + 72, sa, 8);
    } else {
        int32_t s0, s1;
        sum(s0, s1);
        const int32_t corr[2] = {-F::kOff * s0, -F::kOff * s1};
        std::memcpy(r + 72, corr, 8);
    }
}

// step(p, class) for the group's pairs p = 0 .. np - 1, class = std::integral_constant<int, p mod 4>
// (the accumulator its blocks go to): runs of 4, then the last np % 4 pairs. Those take classes 0,
// 1, 2, each its own accumulator, so their order is free: one entry, one exit (clang split the
// accumulators' live ranges around three ifs and spilled them: I7).
template <class Step>
LB_LR_INLINE void each_pair(int64_t np, const Step &step) {
    int64_t p = 0;
    for (; p + 4 <= np; p += 4) {
        step(p, std::integral_constant<int, 0>{});
        step(p + 1, std::integral_constant<int, 1>{});
        step(p + 2, std::integral_constant<int, 2>{});
        step(p + 3, std::integral_constant<int, 3>{});
    }
    switch (np - p) {
        case 3: step(p + 2, std::integral_constant<int, 2>{}); [[fallthrough]];
        case 2: step(p + 1, std::integral_constant<int, 1>{}); [[fallthrough]];
        case 1: step(p, std::integral_constant<int, 0>{}); break;
        default: break;
    }
}
