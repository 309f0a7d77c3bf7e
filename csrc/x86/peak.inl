// `lowbit bench peak`: the multiply-add peak of one thread at one level, the ceiling a GEMM's
// MAC rate is a share of. Shared body of csrc/x86/{avx2,avx2vnni,avx512}/peak.cpp (LOWBIT_NS,
// built with that level's flags). Each loop runs NCH = 12 independent accumulator chains
// (enough to cover the multiply-add's latency on every x86 core measured) for `iters`
// rounds and returns the multiply-adds done; *sink keeps the result alive.
//   int8: avx512 / avx2vnni one vpdpbusd per chain and round (64 / 32 MACs); avx2 (no VNNI)
//         vpmaddubsw + vpmaddwd + vpaddd (32 MACs per three instructions: what the avx2 kernels
//         issue per 32 products)
//   f32:  one vfmadd231ps per chain and round (16 / 8 MACs)
//   int8 with int16 sums (avx2 only, peak_int8_i16): vpmaddubsw + vpaddw (32 MACs per two)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace lowbit {
namespace LOWBIT_NS {

constexpr int NCH = 12;

#if defined(__AVX512F__)
using VI = __m512i;
using VF = __m512;
constexpr int LANES32 = 16;
#define LB_PK(x) _mm512_##x
#else
using VI = __m256i;
using VF = __m256;
constexpr int LANES32 = 8;
#define LB_PK(x) _mm256_##x
#endif

// (12 named accumulators: an array indexed in the loop lives on the stack, I7)
#define LB_PK_ALL(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define LB_PK_KEEP(c) __asm__("" : "+v"(a##c));

#if defined(__AVX512VNNI__)
#define LB_PK_I8(c) a##c = _mm512_dpbusd_epi32(a##c, x, y);
#elif defined(__AVXVNNI__)
#define LB_PK_I8(c) a##c = _mm256_dpbusd_avx_epi32(a##c, x, y);
#else
// (x is made opaque before every chain's product: the two multiplies do not depend on the
// accumulator, so without it GCC computes them once, outside the loop, and times vpaddd alone)
#define LB_PK_I8(c)                   \
    __asm__("" : "+v"(x));            \
    a##c = _mm256_add_epi32(a##c, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), one));
#endif

uint64_t peak_int8(int64_t iters, uint64_t *sink) {
#define LB_PK_DECL(c) VI a##c = LB_PK(set1_epi32)(c);
    LB_PK_ALL(LB_PK_DECL)
#undef LB_PK_DECL
    VI x = LB_PK(set1_epi8)(3), y = LB_PK(set1_epi8)(-2);
    [[maybe_unused]] VI one = LB_PK(set1_epi16)(1);
    __asm__("" : "+v"(x), "+v"(y), "+v"(one));
    for (int64_t i = 0; i < iters; ++i) {
        LB_PK_ALL(LB_PK_I8)
        LB_PK_ALL(LB_PK_KEEP)
    }
#define LB_PK_SUM(c) s = LB_PK(add_epi32)(s, a##c);
    VI s = LB_PK(set1_epi32)(0);
    LB_PK_ALL(LB_PK_SUM)
#undef LB_PK_SUM
    int32_t v[LANES32];
    std::memcpy(v, &s, sizeof v);
    *sink += (uint64_t)(uint32_t)v[0];
    return (uint64_t)iters * NCH * LANES32 * 4;
}

#if !defined(__AVX512F__) && !defined(__AVXVNNI__)
// avx2's second int8 ceiling: vpmaddubsw + vpaddw per chain and round (32 MACs per two
// instructions, the int16 sums wrapping here), the sequence of its GEMMs' inner loops where the
// codes are narrow (csrc/x86/gemm.inl's presum16: a vpmaddwd only every 4-8 rounds). Exact only
// for bounded operands, so not a general int8 dot; a Zen 3 issues it at up to twice the rate of
// peak_int8's three-instruction dot.
uint64_t peak_int8_i16(int64_t iters, uint64_t *sink) {
#define LB_PK_DECL(c) VI a##c = LB_PK(set1_epi16)(c);
    LB_PK_ALL(LB_PK_DECL)
#undef LB_PK_DECL
    VI x = LB_PK(set1_epi8)(3), y = LB_PK(set1_epi8)(-2);
    __asm__("" : "+v"(x), "+v"(y));
#define LB_PK_I16(c)        \
    __asm__("" : "+v"(x)); \
    a##c = _mm256_add_epi16(a##c, _mm256_maddubs_epi16(x, y));
    for (int64_t i = 0; i < iters; ++i) {
        LB_PK_ALL(LB_PK_I16)
        LB_PK_ALL(LB_PK_KEEP)
    }
#undef LB_PK_I16
#define LB_PK_SUM(c) s = LB_PK(add_epi16)(s, a##c);
    VI s = LB_PK(set1_epi16)(0);
    LB_PK_ALL(LB_PK_SUM)
#undef LB_PK_SUM
    int16_t v[2 * LANES32];
    std::memcpy(v, &s, sizeof v);
    *sink += (uint64_t)(uint16_t)v[0];
    return (uint64_t)iters * NCH * LANES32 * 4;
}
#endif

uint64_t peak_f32(int64_t iters, uint64_t *sink) {
#define LB_PK_DECL(c) VF a##c = LB_PK(set1_ps)((float)(c));
    LB_PK_ALL(LB_PK_DECL)
#undef LB_PK_DECL
    VF x = LB_PK(set1_ps)(0.999f), y = LB_PK(set1_ps)(1e-3f);
    __asm__("" : "+v"(x), "+v"(y));
#define LB_PK_F(c) a##c = LB_PK(fmadd_ps)(a##c, x, y);
    for (int64_t i = 0; i < iters; ++i) {
        LB_PK_ALL(LB_PK_F)
        LB_PK_ALL(LB_PK_KEEP)
    }
#undef LB_PK_F
#define LB_PK_SUM(c) s = LB_PK(add_ps)(s, a##c);
    VF s = LB_PK(setzero_ps)();
    LB_PK_ALL(LB_PK_SUM)
#undef LB_PK_SUM
    float v[LANES32];
    std::memcpy(v, &s, sizeof v);
    *sink += (uint64_t)v[0];
    return (uint64_t)iters * NCH * LANES32;
}

#undef LB_PK_I8
#undef LB_PK_KEEP
#undef LB_PK_ALL
#undef LB_PK

}  // namespace LOWBIT_NS
}  // namespace lowbit
