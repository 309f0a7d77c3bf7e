// i-quant row kernels against Q8_K activations: IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S, IQ1_S, IQ1_M. (IQ4_NL x Q8_0 lives with the legacy formats.) Shared body of
// csrc/x86/{avx2,avx2vnni,avx512}/iquants.cpp; the including file defines LOWBIT_ISA
// (ISA_AVX2, ISA_AVX2VNNI or ISA_AVX512) and LOWBIT_NS (the level's namespace) and is built
// with that level's flags only. Layouts and arithmetic: csrc/ref/iquants.cpp (the spec);
// grids: csrc/ref/iq_tables.h (generated from gguf-py; the tables derived here -- parity
// nibbles, the IQ4 code book as bytes, each grid's largest magnitude -- are constexpr
// functions of it, never typed in).
//
// Contract (csrc/kernels.h, DESIGN.md): out[t * out_stride + r] = dot(W[r], act[t]) for r in
// [r0, r1), t < nt. rows[1] is rows_one (one token), rows[2..8] rows_window<NT> (a window),
// chosen by measurement (register_iquants).
//
// ---- Decode once per window, then per token only load, (sign,) maddubs, madd/dpwssd, add ----
// A 256-weight block is walked in 8 groups of 32 weights. Each group is decoded ONCE per
// window (grid rows by scalar loads or a gather, sign bits without a table lookup per 8
// weights, the sub-block scales of the block once) into
//   u   32 unsigned bytes, lane j = weight j of the group (low 128 bits: weights 0..15),
//   sc  16 int16: the integer sub-block scale of each int16 lane of maddubs(u, q8)
//       (low 8 lanes: weights 0..15, high 8: weights 16..31),
// and each token t of the window then costs one 32-byte load of its Q8_K quants and
//   avx2      i_t = i_t + madd(maddubs(u, q8), sc)          (maddubs, madd, add)
//   avx2vnni  i_t = dpwssd(i_t, maddubs(u, q8), sc)         (maddubs, dpwssd)
//   avx512    the same as avx2vnni on ymm (EVEX, 32 registers, mask registers for signs).
// avx512 stays at 256 bits: these kernels are bound by the decode, and while 512-bit uops
// are in flight port 1's vector ALU is off; a zmm variant (two groups per instruction) was
// measured slower at nt = 1..3 and equal at nt = 8.
// Two ways to make the weights unsigned for maddubs (its first operand is unsigned):
//   offset (IQ2_*, IQ3_* at nt >= 3; IQ1_* always): u = c +- grid, c the grid's largest
//     magnitude, so no per-token sign step; the offset's share c * sum(scale * q8) is
//     removed once per block and token via the Q8_K bsums (exact sums of 16 quants):
//     i_t starts at madd(bsums_t, k16), k16 = -c * (scale of each 16-weight chunk).
//     IQ1_*: u = grid + 1 (IQ1_M: 8 * (grid + 1) + 1 + dsign), the +1 and the delta term
//     folded into k16 (see the formats).
//   sign (IQ4_XS always, whose code book spans -127..113; IQ2_*, IQ3_* at nt <= 2): u = |w|,
//     and each token's quants take the weight's sign first (sign_epi8; avx512 grid formats:
//     a masked subtract under a vptestmb mask), one op per token and group.
// Both give the same exact integer. A token's int32 lanes are reduced once per block to its
// block integer: the reference's sum over sub-blocks of scale * sum(w * q8).
//
// ---- Exactness (I1) -------------------------------------------------------------------------
// Q8_K quants are in [-127, 127] (ggml's quantizer scales by -127/max). maddubs adds two
// products u*q into int16 and saturates past 32767:
//   offset: u <= 2c: IQ2 (c 43) 2*86*127 = 21844; IQ3_XXS (c 62) 2*124*127 = 31496;
//           IQ3_S (c 15) 7620; IQ1_S (u <= 2) 508; IQ1_M (u <= 18) 4572;
//   sign:   u = |w| <= 127 (IQ4_XS), <= 62 (grids): 2*127*127 = 32258.
// All below 32767, so int16 partials are exact; madd/dpwssd widen to int32 at once. The block
// integer is below 2^27 in magnitude (IQ4_XS: 8 * 32 * 32 * 127 * 127), inside int32.
//
// ---- Float steps (I2, I3, I5) ---------------------------------------------------------------
// The float part is the reference's, per block and token (lane t of one ymm holds token t):
//   sumf_t = sumf_t + (d_w * d_t) * (float)X_t      (no fma; IQ1_*: * (0.125f * (float)X_t),
// which equals the reference's G + 0.125 * D exactly since |X| < 2^24), and after the last
// block out = kFinal * sumf_t. rows_one does the same steps in SSE lanes and scalars (an SSE
// lane rounds as the scalar op does). An exact integer does not depend on how its terms were
// grouped (scheme, lanes, window, chunk), so a token's result is the same for every nt (I2)
// and row split (I3), and for the formats whose reference adds one float term per block (all
// but IQ4_XS) it is bitwise the scalar reference's. IQ4_XS's reference adds a float term per
// 32 weights; here its scales are applied in the integer domain (as ggml's AVX2 kernel does)
// and one float term is added per block: within 1e-5 of the reference, ggml and float64.
//
// ---- Registers (I7) -------------------------------------------------------------------------
// Per-token accumulators are the named registers i0..i7 (LB_IQ_EACH, each use guarded by
// `if constexpr (NT > t)`); the window's float sums are one ymm. On the 16-register ymm
// levels a window of 5..8 runs in two chunks (see rows_window); block state is at most two
// ymm; uniform constants are loaded at their use (kd); the compiler's reassociation and
// induction-variable tricks that would spill are fenced with empty asm statements.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "../formats.h"
#include "../kernels.h"
#include "../ref/iq_tables.h"
#include "hsum.h"
#include "prefetch.h"

#ifndef LOWBIT_ISA
#error "define LOWBIT_ISA and LOWBIT_NS before including iquants.inl"
#endif
// The preprocessor cannot see the Isa enum: the level is read off the compiler's flags
// (each level's directory is built with exactly its own), and checked against LOWBIT_ISA.
#if defined(__AVX512F__)
#define LB_IQ_LEVEL 3
#elif defined(__AVXVNNI__)
#define LB_IQ_LEVEL 2
#else
#define LB_IQ_LEVEL 1
#endif

namespace lowbit {
namespace LOWBIT_NS {
namespace {
static_assert(LB_IQ_LEVEL == (int)LOWBIT_ISA, "iquants.inl: the level's flags do not match LOWBIT_ISA");

#define LB_IQ_INLINE inline __attribute__((always_inline))
#define LB_IQ_EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define LB_IQ_LAMBDA __attribute__((always_inline))

using VY = __m256i;
using VX = __m128i;

// ---- tables derived from iq_tables.h (constexpr: they cannot drift from it) ----------------
struct Bytes16 { alignas(16) uint8_t v[16]; };
// Byte k: 0x80 when k (a 4-bit value) has an odd number of set bits, else 0: the 8th sign bit
// of a ksigns entry, folded to a nibble (ksigns_iq2xs[k] = k | parity(k) << 7).
constexpr Bytes16 make_parity80() {
    Bytes16 t{};
    for (int k = 0; k < 16; ++k) t.v[k] = (uint8_t)(iq::ksigns_iq2xs[k] & 0x80);
    return t;
}
constexpr Bytes16 make_iq4_val() {
    Bytes16 t{};
    for (int k = 0; k < 16; ++k) t.v[k] = (uint8_t)iq::kvalues_iq4nl[k];
    return t;
}
constexpr Bytes16 kParity80 = make_parity80();
constexpr Bytes16 kIq4Val = make_iq4_val();
// Largest grid magnitude of each grid (the offset c of the offset scheme), read off the
// tables: every byte of every row.
template <class T, size_t N>
constexpr int grid_max(const T (&g)[N]) {
    int m = 0;
    for (size_t i = 0; i < N; ++i)
        for (size_t j = 0; j < sizeof(T); ++j) {
            const int b = (int)((g[i] >> (8 * j)) & 0xff);
            m = b > m ? b : m;
        }
    return m;
}
constexpr int kC2xxs = grid_max(iq::iq2xxs_grid), kC2xs = grid_max(iq::iq2xs_grid);
constexpr int kC2s = grid_max(iq::iq2s_grid), kC3xxs = grid_max(iq::iq3xxs_grid);
constexpr int kC3s = grid_max(iq::iq3s_grid);
static_assert(kC2xxs <= 43 && kC2xs <= 43 && kC2s <= 43 && kC3xxs <= 63 && kC3s <= 63,
              "offset scheme: 2 * (2c) * 127 must stay below 32767 (maddubs saturation)");

// ---- small helpers ----------------------------------------------------------------------------
LB_IQ_INLINE VY ldy(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
LB_IQ_INLINE uint32_t ld_u32(const void *p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
LB_IQ_INLINE uint16_t ld_u16(const void *p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
LB_IQ_INLINE VX ld64x(const void *p) { return _mm_loadl_epi64((const __m128i *)p); }
LB_IQ_INLINE float f16(const uint8_t *p) { return _cvtsh_ss(ld_u16(p)); }
LB_IQ_INLINE VY bcast32(uint32_t x) { return _mm256_set1_epi32((int)x); }

// Uniform vector constants are broadcast from memory at their point of use (one load uop).
// Left to itself GCC builds them in a general register, hoists them out of the row loop and,
// with a window's 8 accumulators live in 16 ymm, spills them to the stack (I7). Non-uniform
// constants come from the constant pool, which the register allocator reads in place.
template <uint32_t V> struct KD { static constexpr uint32_t v = V; };
template <uint64_t V> struct KQ { static constexpr uint64_t v = V; };
#if LB_IQ_LEVEL == 3
#define LB_IQ_VREG "=v"
#define LB_IQ_VREG_RAW(x) "v"(x)
#else
#define LB_IQ_VREG "=x"
#define LB_IQ_VREG_RAW(x) "x"(x)
#endif
template <uint32_t V> LB_IQ_INLINE VY kd() {
    VY r;
    __asm__ volatile("vpbroadcastd %1, %0" : LB_IQ_VREG(r) : "m"(KD<V>::v));
    return r;
}
template <uint32_t V> LB_IQ_INLINE VX kdx() {
    VX r;
    __asm__ volatile("vpbroadcastd %1, %0" : LB_IQ_VREG(r) : "m"(KD<V>::v));
    return r;
}
template <uint64_t V> LB_IQ_INLINE VY kq() {
    VY r;
    __asm__ volatile("vpbroadcastq %1, %0" : LB_IQ_VREG(r) : "m"(KQ<V>::v));
    return r;
}
// A 16-byte table in both 128-bit lanes (for pshufb), loaded at its use for the same reason.
LB_IQ_INLINE VY tab16(const Bytes16 &t) {
    VY r;
#if LB_IQ_LEVEL == 3
    __asm__ volatile("vbroadcasti32x4 %1, %0" : LB_IQ_VREG(r) : "m"(t));  // EVEX: any of ymm0..31
#else
    __asm__ volatile("vbroadcasti128 %1, %0" : LB_IQ_VREG(r) : "m"(t));
#endif
    return r;
}
// A whole 32-byte constant (shuffle and permute indices, per-lane shift counts). clang hoists
// such literals out of the block loop into registers the accumulators need (I7), so under
// clang it is loaded at its use like kd(). GCC folds it into its user as a memory operand,
// which an asm load would prevent (a separate load: IQ3_S measured 5% slower), so GCC gets
// a plain load. Built by the constexpr makers below from the literal's values.
struct Y32 { alignas(32) uint8_t v[32]; };
LB_IQ_INLINE VY ky(const Y32 &t) {
#if defined(__clang__)
    VY r;
#if LB_IQ_LEVEL == 3
    __asm__ volatile("vmovdqu32 %1, %0" : LB_IQ_VREG(r) : "m"(t));  // EVEX: any of ymm0..31
#else
    __asm__ volatile("vmovdqu %1, %0" : LB_IQ_VREG(r) : "m"(t));
#endif
    return r;
#else
    return _mm256_load_si256((const __m256i *)t.v);
#endif
}
constexpr Y32 y_q(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {  // as _mm256_setr_epi64x
    const uint64_t q[4] = {a, b, c, d};
    Y32 t{};
    for (int i = 0; i < 32; ++i) t.v[i] = (uint8_t)(q[i / 8] >> (8 * (i % 8)));
    return t;
}
constexpr Y32 y_d(int32_t a, int32_t b, int32_t c, int32_t d, int32_t e, int32_t f, int32_t g, int32_t h) {  // _epi32
    const int32_t x[8] = {a, b, c, d, e, f, g, h};
    Y32 t{};
    for (int i = 0; i < 32; ++i) t.v[i] = (uint8_t)((uint32_t)x[i / 4] >> (8 * (i % 4)));
    return t;
}
constexpr Y32 y_w4(int16_t a, int16_t b, int16_t c, int16_t d) {  // _epi16 of (a, b, c, d) x 4
    const int16_t x[4] = {a, b, c, d};
    Y32 t{};
    for (int i = 0; i < 32; ++i) t.v[i] = (uint8_t)((uint16_t)x[(i / 2) % 4] >> (8 * (i % 2)));
    return t;
}
constexpr Y32 y_b16(const uint8_t (&x)[16]) {  // _epi8 of the 16 bytes, in both lanes
    Y32 t{};
    for (int i = 0; i < 32; ++i) t.v[i] = x[i % 16];
    return t;
}
constexpr uint64_t kB8 = 0x0101010101010101ULL;  // a byte in all 8 bytes of a qword
constexpr uint32_t b4(uint8_t x) { return 0x01010101u * x; }       // a byte in all 4 bytes
constexpr uint32_t w2(uint16_t x) { return 0x00010001u * x; }      // a word in both halves
constexpr uint32_t fbits(float f) { return __builtin_bit_cast(uint32_t, f); }
template <uint32_t Bits> LB_IQ_INLINE __m256 kps() { return _mm256_castsi256_ps(kd<Bits>()); }

// 8 rows of a 32-bit grid (4 byte lanes each) by a gather: for 8 rows, measured faster on an
// Intel Xeon than 8 scalar loads and inserts (IQ3_S nt = 1: 0.21 vs 0.26 us per row of 2560);
// slower on AMD Zen (grid8s; the choice: iq_grid_by_loads() in kernels.h).
LB_IQ_INLINE VY grid8d(const uint32_t *tab, VY idx) {
    return _mm256_i32gather_epi32((const int *)tab, idx, 4);
}
// The same 8 grid rows by scalar loads and inserts (ggml's way): on AMD Zen a ymm gather is
// microcoded and slower than 8 loads; idx(i) gives index i.
template <class Idx>
LB_IQ_INLINE VY grid8s(const uint32_t *tab, Idx idx) {
    const VX lo = _mm_setr_epi32((int)tab[idx(0)], (int)tab[idx(1)], (int)tab[idx(2)], (int)tab[idx(3)]);
    const VX hi = _mm_setr_epi32((int)tab[idx(4)], (int)tab[idx(5)], (int)tab[idx(6)], (int)tab[idx(7)]);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

// Compile-time loop: f(std::integral_constant<int, 0>{}) .. f(<N-1>), so that a group's index
// is a constant (immediates, constant-pool vectors) in its decode.
template <class F, int... I>
LB_IQ_INLINE void unroll_seq(F &&f, std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>{}), ...); }
template <int N, class F>
LB_IQ_INLINE void unroll(F &&f) { unroll_seq(f, std::make_integer_sequence<int, N>{}); }

// ---- block scale vectors ----------------------------------------------------------------------
// e: int16 words; lane 0 word g = the scale of group g's weights 0..15, lane 1 word g = that of
// its weights 16..31 (equal for formats with one scale per 32). A group's maddubs-lane scale
// vector is then one pshufb: word g broadcast within each lane.
constexpr uint32_t wsel(int g) {
    return (uint32_t)(2 * g) | (uint32_t)(2 * g + 1) << 8 | (uint32_t)(2 * g) << 16 | (uint32_t)(2 * g + 1) << 24;
}
template <int G> LB_IQ_INLINE VY scale_of(VY e) { return _mm256_shuffle_epi8(e, kd<wsel(G)>()); }
// 8 dword scales [x0..x3 | x4..x7] -> e = [x0..x7 | x0..x7] (one scale per 32 weights).
LB_IQ_INLINE VY words8(VY x) { return _mm256_permute4x64_epi64(_mm256_packs_epi32(x, x), 0x88); }
// 8 scale bytes (byte g of v: group g) -> e = [b0..b7 | b0..b7] as int16 words.
LB_IQ_INLINE VY e_from_bytes(uint64_t v) { return _mm256_cvtepu8_epi16(_mm_set1_epi64x((long long)v)); }
// e of one scale per 32 -> per-16-chunk words [x0 x0 x1 x1 .. x3 x3 | x4 x4 .. x7 x7] (the
// Q8_K bsums order: chunk k = 16 weights, group k / 2).
LB_IQ_INLINE VY chunks_of_e32(VY e) {
    return _mm256_blend_epi32(_mm256_unpacklo_epi16(e, e), _mm256_unpackhi_epi16(e, e), 0xf0);
}
// e with separate half scales [lo0..lo7 | hi0..hi7] -> chunk order [lo0 hi0 lo1 hi1 .. | lo4 hi4 ..].
LB_IQ_INLINE VY chunks_of_e16(VY e) {
    const VY x = _mm256_permute4x64_epi64(e, 0xd8);  // [lo0..3 hi0..3 | lo4..7 hi4..7]
    return _mm256_unpacklo_epi16(x, _mm256_bsrli_epi128(x, 8));
}
// 4-bit scale nibbles (IQ2_XS / IQ2_S: byte g, low nibble = weights 0..15, high = 16..31)
// -> e = [2 lo + 1 | 2 hi + 1].
LB_IQ_INLINE VY e_from_nibbles(const uint8_t *p) {
    const VX s = ld64x(p);
    const VX m4 = kdx<b4(0x0f)>();
    const VX lohi = _mm_unpacklo_epi64(_mm_and_si128(s, m4), _mm_and_si128(_mm_srli_epi16(s, 4), m4));
    return _mm256_cvtepu8_epi16(_mm_add_epi8(_mm_add_epi8(lohi, lohi), kdx<b4(1)>()));
}

// 4 rows of a 64-bit grid by scalar loads, indices as 16-bit fields of p or bytes at idx: for
// 4 rows, measured faster here than vpgatherdq on every level (IQ2_XS nt = 3, avx512: 0.078
// vs 0.090 us per row of 2560 and token).
LB_IQ_INLINE VY grid4q_w(const uint64_t *tab, uint64_t p) {
    return _mm256_setr_epi64x((long long)tab[p & 0xffff], (long long)tab[(p >> 16) & 0xffff],
                              (long long)tab[(p >> 32) & 0xffff], (long long)tab[p >> 48]);
}
LB_IQ_INLINE VY grid4q_b(const uint64_t *tab, const uint8_t *idx) {  // one byte load per index
    return _mm256_setr_epi64x((long long)tab[idx[0]], (long long)tab[idx[1]], (long long)tab[idx[2]], (long long)tab[idx[3]]);
}
LB_IQ_INLINE uint64_t ld_u64(const void *p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

// Sign-bit bytes: byte lane j of each 8-lane group holds (a copy of) its group's sign byte, to
// be tested against bit j. The selector and the 4-explicit-byte layout of IQ2_S / IQ3_S:
LB_IQ_INLINE VY bitsel() { return kq<0x8040201008040201ULL>(); }
LB_IQ_INLINE VY sign_bytes4(uint32_t four) {  // byte l of `four` -> lanes 8l..8l+7
    static constexpr Y32 sel = y_q(0, kB8, 2 * kB8, 3 * kB8);
    return _mm256_shuffle_epi8(bcast32(four), ky(sel));
}

enum Kind { kGrid, kKv, kBaked };  // see "formats" below

// Per level: SA, a token step's sign operand (lanes whose quants are negated), made once per
// group from sign-bit bytes (grid formats) or from the signed codes (IQ4_XS); negate() applies
// it to a token's quants; offset_u<C>() makes the offset scheme's unsigned code C +- grid.
#if LB_IQ_LEVEL == 3
// grid formats: a lane mask from vptestmb, applied by a masked subtract; IQ4_XS: its signed
// codes with (VEX) sign_epi8, one op per token and group.
template <bool kKvFormat> struct SignOperand { using type = __mmask32; };
template <> struct SignOperand<true> { using type = VY; };
template <class D> using SA = typename SignOperand<D::kKind == kKv>::type;
LB_IQ_INLINE __mmask32 sign_from_bits(VY sb) { return _mm256_test_epi8_mask(sb, bitsel()); }
LB_IQ_INLINE VY sign_from_kv(VY kv) { return kv; }
LB_IQ_INLINE VY negate(VY q, __mmask32 k) { return _mm256_mask_sub_epi8(q, k, _mm256_setzero_si256(), q); }
LB_IQ_INLINE VY negate(VY q, VY s) { return _mm256_sign_epi8(q, s); }
template <int C>
LB_IQ_INLINE VY offset_u(VY g, VY sb) {
    const VY c = kd<b4(C)>();
    return _mm256_mask_sub_epi8(_mm256_add_epi8(g, c), sign_from_bits(sb), c, g);
}
#else
template <class D> using SA = VY;  // sign_epi8's sign source: +-1 bytes (never 0)
LB_IQ_INLINE VY bits_to_mask(VY b) {  // 0xff where the selected bit is set
    const VY sel = bitsel();
    return _mm256_cmpeq_epi8(_mm256_and_si256(b, sel), sel);
}
LB_IQ_INLINE VY sign_from_bits(VY sb) { return _mm256_or_si256(bits_to_mask(sb), kd<b4(1)>()); }
LB_IQ_INLINE VY sign_from_kv(VY kv) { return kv; }  // kvalues_iq4nl has no 0
LB_IQ_INLINE VY negate(VY q, VY s) { return _mm256_sign_epi8(q, s); }
template <int C>
LB_IQ_INLINE VY offset_u(VY g, VY sb) {  // c + (m ? -g : g) = (g ^ m) + (c - m), m = 0 / -1
    const VY m = bits_to_mask(sb);
    return _mm256_add_epi8(_mm256_xor_si256(g, m), _mm256_sub_epi8(kd<b4(C)>(), m));
}
#endif

// Dword lanes x (small ints) as int16 pairs (x, x): the int16 view has lanes 2k, 2k+1 = x_k.
LB_IQ_INLINE VY dup16(VY x) { return _mm256_or_si256(_mm256_and_si256(x, kd<0xffff>()), _mm256_slli_epi32(x, 16)); }

// 8 sign-index fields of 7 bits (aux dword g: field l in bits 7l..7l+6, l = 0..3) -> the
// full ksigns bytes at byte 4g + l: the 8th bit is the parity of the 7 (no table lookup).
LB_IQ_INLINE VY ksigns_from_aux(VY a) {
    VY t = _mm256_and_si256(a, kd<0x7f>());
    t = _mm256_or_si256(t, _mm256_and_si256(_mm256_slli_epi32(a, 1), kd<0x7f00>()));
    t = _mm256_or_si256(t, _mm256_and_si256(_mm256_slli_epi32(a, 2), kd<0x7f0000>()));
    t = _mm256_or_si256(t, _mm256_and_si256(_mm256_slli_epi32(a, 3), kd<0x7f000000>()));
    // parity of each 7-bit byte: fold the high nibble onto the low one, then a 16-entry table
    const VY nib = _mm256_and_si256(_mm256_xor_si256(t, _mm256_srli_epi16(t, 4)), kd<b4(0x0f)>());
    return _mm256_or_si256(t, _mm256_shuffle_epi8(tab16(kParity80), nib));
}
// Group G's sign-bit bytes from the ksigns bytes of ksigns_from_aux.
template <int G>
LB_IQ_INLINE VY signs_from_ks(VY ks) {
    const VY half = G < 4 ? _mm256_permute4x64_epi64(ks, 0x44) : _mm256_permute4x64_epi64(ks, 0xee);
    constexpr uint64_t k = 4 * (G & 3);
    static constexpr Y32 sel = y_q(kB8 * k, kB8 * (k + 1), kB8 * (k + 2), kB8 * (k + 3));
    return _mm256_shuffle_epi8(half, ky(sel));
}

// ======================= formats ============================================================
// How a format's group becomes maddubs' unsigned operand:
//   kGrid   u = grid magnitudes and sign-bit bytes sb: sign scheme (negate the quants) or
//           offset scheme (u = kC +- grid, bsums correction k16 = -kC * scale);
//   kKv     IQ4_XS: u = |code|, sb = the signed code: sign scheme only;
//   kBaked  IQ1_*: u already unsigned (offset and delta folded in), correction k16; no signs.

// Each format: kBytes, kKind, kC; half(blk) (the fp16 bits of d); dw(); k16() (the bsums
// multipliers of a block for the offset scheme); kPost (float factor on the block integer
// before d: IQ1's 0.125); kFinal (the reference's constant after the last block); and
// group<G>(u, sb, sc). A decoder is built per block; its state (the block's scale vector e,
// sign bytes) is at most two ymm.

// ---- IQ2_XXS: per group 4 index bytes + aux (4 x 7 sign bits, scale in bits 28..31) -------
struct Iq2xxs {
    static constexpr int kBytes = sizeof(block_iq2_xxs);
    static constexpr Kind kKind = kGrid;
    static constexpr int kC = kC2xxs;
    static constexpr float kPost = 1.0f, kFinal = 0.125f;
    static LB_IQ_INLINE uint16_t half(const uint8_t *blk) { return ld_u16(blk); }  // fp16 d
    const uint8_t *q;
    VY ks, e;
    LB_IQ_INLINE explicit Iq2xxs(const uint8_t *b) : q(b + 2) {
        // the aux dwords are the odd dwords of qs
        static constexpr Y32 odd = y_d(1, 3, 5, 7, 1, 3, 5, 7);
        const VY a0 = _mm256_permutevar8x32_epi32(ldy(q), ky(odd));
        const VY a1 = _mm256_permutevar8x32_epi32(ldy(q + 32), ky(odd));
        const VY a = _mm256_blend_epi32(a0, a1, 0xf0);
        ks = ksigns_from_aux(a);
        const VY s = _mm256_srli_epi32(a, 28);
        e = words8(_mm256_add_epi32(_mm256_add_epi32(s, s), kd<1>()));
    }
    LB_IQ_INLINE float dw() const { return f16(q - 2); }
    LB_IQ_INLINE VY k16() const { return _mm256_mullo_epi16(chunks_of_e32(e), kd<w2((uint16_t)-kC)>()); }
    template <int G>
    LB_IQ_INLINE void group(VY &u, VY &sb, VY &sc) const {
        u = grid4q_b(iq::iq2xxs_grid, q + 8 * G);
        sb = signs_from_ks<G>(ks);
        sc = scale_of<G>(e);
    }
};

// ---- IQ3_XXS: per group 8 index bytes (4-lane grid rows); aux dwords after the indices -----
// Loads: the grid rows by scalar loads (true) or a gather (false): iq_grid_by_loads().
template <bool Loads>
struct Iq3xxs {
    static constexpr int kBytes = sizeof(block_iq3_xxs);
    static constexpr Kind kKind = kGrid;
    static constexpr int kC = kC3xxs;
    static constexpr float kPost = 1.0f, kFinal = 0.25f;
    static LB_IQ_INLINE uint16_t half(const uint8_t *blk) { return ld_u16(blk); }  // fp16 d
    const uint8_t *q;
    VY ks, e;
    LB_IQ_INLINE explicit Iq3xxs(const uint8_t *b) : q(b + 2) {
        const VY a = ldy(q + QK_K / 4);
        ks = ksigns_from_aux(a);
        const VY s = _mm256_srli_epi32(a, 28);
        e = words8(_mm256_add_epi32(_mm256_add_epi32(s, s), kd<1>()));
    }
    LB_IQ_INLINE float dw() const { return f16(q - 2); }
    LB_IQ_INLINE VY k16() const { return _mm256_mullo_epi16(chunks_of_e32(e), kd<w2((uint16_t)-kC)>()); }
    template <int G>
    LB_IQ_INLINE void group(VY &u, VY &sb, VY &sc) const {
        if constexpr (Loads) {
            const uint8_t *ix = q + 8 * G;
            u = grid8s(iq::iq3xxs_grid, [ix](int i) { return ix[i]; });
        } else {
            u = grid8d(iq::iq3xxs_grid, _mm256_cvtepu8_epi32(ld64x(q + 8 * G)));
        }
        sb = signs_from_ks<G>(ks);
        sc = scale_of<G>(e);
    }
};

// ---- IQ2_XS: per 8 weights a uint16 (9-bit grid index, 7 sign bits); 4-bit scales per 16 --
struct Iq2xs {
    static constexpr int kBytes = sizeof(block_iq2_xs);
    static constexpr Kind kKind = kGrid;
    static constexpr int kC = kC2xs;
    static constexpr float kPost = 1.0f, kFinal = 0.125f;
    static LB_IQ_INLINE uint16_t half(const uint8_t *blk) { return ld_u16(blk); }  // fp16 d
    const uint8_t *q;
    VY e, fs;  // fs: full sign bytes of the current half block (groups 0..3, then 4..7)
    // Full sign bytes of 16 uint16 codes: byte 2w = the 7 sign bits of word w + their parity
    // (the 8th bit): fold the 7 onto a nibble of the same parity, then a 16-entry pshufb table.
    static LB_IQ_INLINE VY full_signs(VY w) {
        const VY s7 = _mm256_srli_epi16(w, 9);
        const VY fold = _mm256_xor_si256(s7, _mm256_srli_epi16(w, 13));
        return _mm256_or_si256(s7, _mm256_shuffle_epi8(tab16(kParity80), fold));
    }
    LB_IQ_INLINE explicit Iq2xs(const uint8_t *b) : q(b + 2) { e = e_from_nibbles(q + QK_K / 4); }
    LB_IQ_INLINE float dw() const { return f16(q - 2); }
    LB_IQ_INLINE VY k16() const { return _mm256_mullo_epi16(chunks_of_e16(e), kd<w2((uint16_t)-kC)>()); }
    template <int G>
    LB_IQ_INLINE void group(VY &u, VY &sb, VY &sc) {
        if constexpr ((G & 3) == 0) fs = full_signs(ldy(q + 8 * G));
        u = grid4q_w(iq::iq2xs_grid, ld_u64(q + 8 * G) & 0x01ff01ff01ff01ffULL);
        constexpr uint64_t o = 8 * (G & 1);
        static constexpr Y32 sel = y_q(kB8 * o, kB8 * (o + 2), kB8 * (o + 4), kB8 * (o + 6));
        const VY half = (G & 3) < 2 ? _mm256_permute4x64_epi64(fs, 0x44) : _mm256_permute4x64_epi64(fs, 0xee);
        sb = _mm256_shuffle_epi8(half, ky(sel));
        sc = scale_of<G>(e);
    }
};

// ---- IQ2_S: 10-bit grid index (8 low bits + 2 from qh), explicit sign bytes ---------------
struct Iq2s {
    static constexpr int kBytes = sizeof(block_iq2_s);
    static constexpr Kind kKind = kGrid;
    static constexpr int kC = kC2s;
    static constexpr float kPost = 1.0f, kFinal = 0.125f;
    static LB_IQ_INLINE uint16_t half(const uint8_t *blk) { return ld_u16(blk); }  // fp16 d
    const uint8_t *b;
    VY e;
    LB_IQ_INLINE explicit Iq2s(const uint8_t *blk) : b(blk) { e = e_from_nibbles(blk + offsetof(block_iq2_s, scales)); }
    LB_IQ_INLINE float dw() const { return f16(b); }
    LB_IQ_INLINE VY k16() const { return _mm256_mullo_epi16(chunks_of_e16(e), kd<w2((uint16_t)-kC)>()); }
    template <int G>
    LB_IQ_INLINE void group(VY &u, VY &sb, VY &sc) const {
        // qh[G] bits 2l..2l+1 -> index bits 8..9 of 8-group l
        const uint64_t idx = _pdep_u64(ld_u32(b + 2 + 4 * G), 0x00ff00ff00ff00ffULL) |
                             _pdep_u64(b[offsetof(block_iq2_s, qh) + G], 0x0300030003000300ULL);
        u = grid4q_w(iq::iq2s_grid, idx);
        sb = sign_bytes4(ld_u32(b + 2 + QK_K / 8 + 4 * G));
        sc = scale_of<G>(e);
    }
};

// ---- IQ3_S: 9-bit index per 4 weights (8 low bits + qh bit), explicit signs, 4-bit scales --
template <bool Loads>  // as Iq3xxs
struct Iq3s {
    static constexpr int kBytes = sizeof(block_iq3_s);
    static constexpr Kind kKind = kGrid;
    static constexpr int kC = kC3s;
    static constexpr float kPost = 1.0f, kFinal = 1.0f;
    static LB_IQ_INLINE uint16_t half(const uint8_t *blk) { return ld_u16(blk); }  // fp16 d
    const uint8_t *b;
    VY e;
    LB_IQ_INLINE explicit Iq3s(const uint8_t *blk) : b(blk) {
        static constexpr Y32 shifts = y_d(0, 4, 8, 12, 16, 20, 24, 28);
        const VY s = _mm256_and_si256(_mm256_srlv_epi32(bcast32(ld_u32(blk + offsetof(block_iq3_s, scales))), ky(shifts)),
                                      kd<0xf>());
        e = words8(_mm256_add_epi32(_mm256_add_epi32(s, s), kd<1>()));
    }
    LB_IQ_INLINE float dw() const { return f16(b); }
    LB_IQ_INLINE VY k16() const { return _mm256_mullo_epi16(chunks_of_e32(e), kd<w2((uint16_t)-kC)>()); }
    template <int G>
    LB_IQ_INLINE void group(VY &u, VY &sb, VY &sc) const {
        if constexpr (Loads) {
            const uint8_t *ix = b + 2 + 8 * G;
            const uint32_t qh = b[offsetof(block_iq3_s, qh) + G];
            u = grid8s(iq::iq3s_grid, [ix, qh](int i) { return ix[i] | ((qh << (8 - i)) & 256); });
        } else {
            // qh[G] bit k -> index bit 8 of the k-th 4-weight row (bytes above qh[G] shift out of 256)
            static constexpr Y32 shifts = y_d(8, 7, 6, 5, 4, 3, 2, 1);
            const VY h = _mm256_and_si256(
                _mm256_sllv_epi32(bcast32(ld_u32(b + offsetof(block_iq3_s, qh) + G)), ky(shifts)), kd<256>());
            u = grid8d(iq::iq3s_grid, _mm256_or_si256(_mm256_cvtepu8_epi32(ld64x(b + 2 + 8 * G)), h));
        }
        sb = sign_bytes4(ld_u32(b + offsetof(block_iq3_s, signs) + 4 * G));
        sc = scale_of<G>(e);
    }
};

// ---- IQ1_S: 11-bit index per 8 weights, grid -1/0/+1, per-32 scale and offset sign ---------
// Block integer X = 8 * G + D (G = sum ls * grid . q8, D = sum ls * (+-1) * sum q8): with
// u = grid + 1 (0..2) and maddubs scale 8 * ls, the +1 and the delta fold into one bsums term
// k16 = ls * (dsign - 8) per 16-weight chunk.
struct Iq1s {
    static constexpr int kBytes = sizeof(block_iq1_s);
    static constexpr Kind kKind = kBaked;
    static constexpr int kC = 0;
    static constexpr float kPost = 0.125f, kFinal = 1.0f;
    static LB_IQ_INLINE uint16_t half(const uint8_t *blk) { return ld_u16(blk); }  // fp16 d
    const uint8_t *b;
    VY e;
    LB_IQ_INLINE explicit Iq1s(const uint8_t *blk) : b(blk) {
        const VY w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(blk + offsetof(block_iq1_s, qh))));
        const VY s = _mm256_and_si256(_mm256_srli_epi32(w, 12), kd<7>());
        e = words8(_mm256_slli_epi32(_mm256_add_epi32(_mm256_add_epi32(s, s), kd<1>()), 3));
    }
    LB_IQ_INLINE float dw() const { return f16(b); }
    LB_IQ_INLINE VY k16() const {
        const VY w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + offsetof(block_iq1_s, qh))));
        const VY s = _mm256_and_si256(_mm256_srli_epi32(w, 12), kd<7>());
        const VY ls = _mm256_add_epi32(_mm256_add_epi32(s, s), kd<1>());
        // dsign - 8: -7 for a positive offset, -9 for a negative one (bit 15)
        const VY dm8 = _mm256_sub_epi32(kd<(uint32_t)-7>(), _mm256_slli_epi32(_mm256_srli_epi32(w, 15), 1));
        return dup16(_mm256_mullo_epi16(ls, dm8));
    }
    template <int G>
    LB_IQ_INLINE void group(VY &u, VY &sb, VY &sc) const {
        const uint64_t idx = _pdep_u64(ld_u32(b + 2 + 4 * G), 0x00ff00ff00ff00ffULL) |
                             _pdep_u64(ld_u16(b + offsetof(block_iq1_s, qh) + 2 * G), 0x0700070007000700ULL);
        u = _mm256_add_epi8(grid4q_w(iq::iq1s_grid, idx), kd<b4(1)>());
        sb = u;  // unused (no signs)
        sc = scale_of<G>(e);
    }
};

// IQ1_M's unsigned codes straight from a 12-bit index (the 11-bit grid index, and the delta
// sign bit as bit 11): u = 8 * (grid + 1) + (dsign bit ? 0 : 2), the same bytes Iq1m::group
// builds from iq1s_grid with five vector ops (32 KB, a constexpr function of iq1s_grid).
struct Iq1mU { alignas(64) uint64_t v[4096]; };
constexpr Iq1mU make_iq1m_u() {
    Iq1mU t{};
    for (int i = 0; i < 4096; ++i) {
        const uint64_t g = iq::iq1s_grid[i & 2047];
        uint64_t r = 0;
        for (int j = 0; j < 8; ++j) {
            const int gb = (int)(int8_t)(uint8_t)(g >> (8 * j));  // -1, 0, +1
            r |= (uint64_t)(8 * (gb + 1) + ((i >> 11) ? 0 : 2)) << (8 * j);
        }
        t.v[i] = r;
    }
    return t;
}
inline constexpr Iq1mU kIq1mU = make_iq1m_u();

// ---- IQ1_M: 11-bit index per 8 weights, offset sign per 8 weights, 3-bit scales per 16 ----
// X = 8 * G + D with u = 8 * (grid + 1) + (1 + dsign) (0..18, i.e. 8 * grid + dsign + 9) and
// the maddubs scale ls; the +9 is removed by k16 = -9 * ls per 16-weight chunk.
struct Iq1m {
    static constexpr int kBytes = sizeof(block_iq1_m);
    static constexpr Kind kKind = kBaked;
    static constexpr int kC = 0;
    static constexpr float kPost = 0.125f, kFinal = 1.0f;
    // the fp16 super-block scale, spread over the top nibbles of the four scale words
    static LB_IQ_INLINE uint16_t half(const uint8_t *blk) {
        uint16_t sc[4];
        std::memcpy(sc, blk + offsetof(block_iq1_m, scales), 8);
        return (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    }
    const uint8_t *b;
    VY e, k;  // e: [2 ls + 1 of chunks 0, 2, .., 14 | of chunks 1, 3, .., 15]; k: -9 (2 ls + 1), chunk order
    LB_IQ_INLINE explicit Iq1m(const uint8_t *blk) : b(blk) {
        // chunk k = 2 * ib + h: scale word k / 4, bits 3 * (k % 4) .. +2, moved to bits 13..15 by a multiply
        static constexpr Y32 word_sel = y_q(0x0100010001000100ULL, 0x0302030203020302ULL, 0x0504050405040504ULL,
                                            0x0706070607060706ULL);
        static constexpr Y32 to_top = y_w4(8192, 1024, 128, 16);
        const VY words = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(ld64x(b + offsetof(block_iq1_m, scales))), ky(word_sel));
        const VY s = _mm256_srli_epi16(_mm256_mullo_epi16(words, ky(to_top)), 13);
        const VY c16 = _mm256_add_epi16(_mm256_add_epi16(s, s), kd<w2(1)>());
        k = _mm256_mullo_epi16(c16, kd<w2((uint16_t)-9)>());
        // even chunks to lane 0, odd ones to lane 1
        static constexpr Y32 even_odd = y_b16({0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15});
        const VY eo = _mm256_shuffle_epi8(c16, ky(even_odd));
        e = _mm256_permute4x64_epi64(eo, 0xd8);
    }
    LB_IQ_INLINE float dw() const { return _cvtsh_ss(half(b)); }
    LB_IQ_INLINE VY k16() const { return k; }
    template <int G>
    LB_IQ_INLINE void group(VY &u, VY &sb, VY &sc) const {
        // 12-bit indices (qh's nibble l whole: 3 index bits and the delta sign) into kIq1mU:
        // the unsigned codes in one table row per 8 weights. (Built from iq1s_grid instead,
        // they cost a broadcast, a variable shift, an arithmetic shift and four byte ops per
        // group more; measured on avx2 with the table: nt = 1 0.161 against 0.224 us per row
        // of 2560, and 10-30% less at nt = 2..8.)
        const uint32_t qh = ld_u16(b + offsetof(block_iq1_m, qh) + 2 * G);
        const uint64_t idx = _pdep_u64(ld_u32(b + 4 * G), 0x00ff00ff00ff00ffULL) | _pdep_u64(qh, 0x0f000f000f000f00ULL);
        u = grid4q_w(kIq1mU.v, idx);
        sb = u;  // unused (no signs)
        sc = scale_of<G>(e);
    }
};

// ---- IQ4_XS: 4-bit codes into kvalues_iq4nl, 6-bit scales per 32 (sign scheme) ------------
struct Iq4xs {
    static constexpr int kBytes = sizeof(block_iq4_xs);
    static constexpr Kind kKind = kKv;
    static constexpr int kC = 0;
    static constexpr float kPost = 1.0f, kFinal = 1.0f;
    static LB_IQ_INLINE uint16_t half(const uint8_t *blk) { return ld_u16(blk); }  // fp16 d
    const uint8_t *b;
    VY e;
    LB_IQ_INLINE explicit Iq4xs(const uint8_t *blk) : b(blk) {
        // ls + 32 per group as bytes: low 4 bits from scales_l nibbles, high 2 from scales_h
        const uint64_t ls = _pdep_u64(ld_u32(blk + offsetof(block_iq4_xs, scales_l)), 0x0f0f0f0f0f0f0f0fULL) |
                            _pdep_u64(ld_u16(blk + offsetof(block_iq4_xs, scales_h)), 0x3030303030303030ULL);
        e = _mm256_sub_epi16(e_from_bytes(ls), kd<w2(32)>());
    }
    LB_IQ_INLINE float dw() const { return f16(b); }
    LB_IQ_INLINE VY k16() const { return _mm256_setzero_si256(); }  // no offset scheme
    VY nu, nv;  // the odd group's |code| and code, decoded with the even one
    template <int G>
    LB_IQ_INLINE void group(VY &u, VY &sb, VY &sc) {
        if constexpr (G % 2 == 0) {
            // groups G, G + 1 from one 32-byte load: low nibbles = weights 0..15 of each (lanes
            // 0 / 1), high nibbles = weights 16..31; codes first, then the lanes regrouped.
            const VY x = ldy(b + offsetof(block_iq4_xs, qs) + 16 * G);
            const VY m4 = kd<b4(0x0f)>();
            const VY tab = tab16(kIq4Val);
            const VY vlo = _mm256_shuffle_epi8(tab, _mm256_and_si256(x, m4));
            const VY vhi = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4));
            sb = _mm256_permute2x128_si256(vlo, vhi, 0x20);
            nv = _mm256_permute2x128_si256(vlo, vhi, 0x31);
            u = _mm256_abs_epi8(sb);
            nu = _mm256_abs_epi8(nv);
        } else {
            u = nu;
            sb = nv;
        }
        sc = scale_of<G>(e);
    }
};

// ======================= the window kernel ==================================================
constexpr size_t kQ8 = sizeof(block_q8_K);
constexpr size_t kQ8Qs = offsetof(block_q8_K, qs), kQ8Bsums = offsetof(block_q8_K, bsums);

// Per-level token step on one group: acc += scale-weighted pair sums of maddubs(u, q).
#if LB_IQ_LEVEL == 3
constexpr bool kManyRegs = true;  // 32 vector registers: one pass for any window
LB_IQ_INLINE VY step(VY acc, VY u, VY sc, VY q) { return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, q), sc); }
#elif LB_IQ_LEVEL == 2
constexpr bool kManyRegs = false;
LB_IQ_INLINE VY step(VY acc, VY u, VY sc, VY q) { return _mm256_dpwssd_avx_epi32(acc, _mm256_maddubs_epi16(u, q), sc); }
#else
constexpr bool kManyRegs = false;
LB_IQ_INLINE VY step(VY acc, VY u, VY sc, VY q) {
    // The empty asm keeps each token's sum a chain: GCC's reassociation would otherwise
    // rebalance the 8 adds of a block into a tree, keeping 8 partial sums per token live.
    VY r = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), sc));
    __asm__("" : "+x"(r));
    return r;
}
#endif

// Which scheme a window of NT tokens uses for format D: the sign scheme costs one negate per
// token and group, the offset scheme three ops per group plus a bsums term per token and
// block. Both give the same exact integer, so this choice never changes a result (I2).
// Measured (us per row of 2560 and token, nt = 2, offset -> sign): IQ2_XXS avx2 0.121 ->
// 0.117, IQ2_S 0.110 -> 0.103, IQ3_S 0.139 -> 0.128, avx512 IQ3_XXS 0.127 -> 0.108.
constexpr int kSignMaxNT = 2;
template <class D, int NT>
constexpr bool sign_scheme() { return D::kKind == kKv || (D::kKind == kGrid && NT <= kSignMaxNT); }

// Decode group G into the token step's operands.
template <class D, bool kS, int G>
LB_IQ_INLINE void prepare(D &dec, VY &u, SA<D> &s, VY &sc) {
    VY sb;
    dec.template group<G>(u, sb, sc);
    if constexpr (kS) {
        if constexpr (D::kKind == kKv) s = sign_from_kv(sb);
        else s = sign_from_bits(sb);
    } else {
        (void)s;
        if constexpr (D::kKind == kGrid) u = offset_u<D::kC>(u, sb);
    }
}

// Token reduction. quad(x0..x3): int32 lane sums of 4 tokens' accumulators, lanes
// [t0 t1 t2 t3 | t0 t1 t2 t3] (low half from lanes 0..3, high half from 4..7); lanes of
// tokens that do not exist are junk. Transpose-adds of exact integers: the grouping of the
// terms does not matter.
LB_IQ_INLINE VY quad(VY x0, VY x1, VY x2, VY x3) {
    const VY a01 = _mm256_add_epi32(_mm256_unpacklo_epi32(x0, x1), _mm256_unpackhi_epi32(x0, x1));
    const VY a23 = _mm256_add_epi32(_mm256_unpacklo_epi32(x2, x3), _mm256_unpackhi_epi32(x2, x3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(a01, a23), _mm256_unpackhi_epi64(a01, a23));
}
// Lane t = token t's block integer, from quad(tokens 0..3) and quad(tokens 4..7).
LB_IQ_INLINE VY octet(VY q03, VY q47) {
    return _mm256_add_epi32(_mm256_permute2x128_si256(q03, q47, 0x20), _mm256_permute2x128_si256(q03, q47, 0x31));
}


// Per-thread scratch of a call: the d of every token's block i in lane t of row i (zero for
// t >= nt), and the decoded-block buffer of the two-chunk windows below.
struct alignas(64) Decoded { VY u[8], s[8], sc[8]; };
struct Scratch {
    std::vector<float> d;
    Decoded blk;
};
Scratch &scratch(const RowArgs &a, int64_t nb, int nt) {
    static thread_local Scratch sc;
    sc.d.assign((size_t)nb * 8, 0.0f);
    for (int t = 0; t < nt; ++t) {
        const auto *y = reinterpret_cast<const block_q8_K *>(a.act + (size_t)t * a.act_stride);
        for (int64_t i = 0; i < nb; ++i) sc.d[(size_t)i * 8 + t] = y[i].d;
    }
    return sc;
}

template <int NT>
LB_IQ_INLINE void store_tokens(float *o, size_t os, __m256 v) {
    const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    o[0] = _mm_cvtss_f32(lo);
    if constexpr (NT > 1) o[os] = _mm_cvtss_f32(_mm_movehdup_ps(lo));
    if constexpr (NT > 2) o[2 * os] = _mm_cvtss_f32(_mm_unpackhi_ps(lo, lo));
    if constexpr (NT > 3) o[3 * os] = _mm_cvtss_f32(_mm_shuffle_ps(lo, lo, 3));
    if constexpr (NT > 4) o[4 * os] = _mm_cvtss_f32(hi);
    if constexpr (NT > 5) o[5 * os] = _mm_cvtss_f32(_mm_movehdup_ps(hi));
    if constexpr (NT > 6) o[6 * os] = _mm_cvtss_f32(_mm_unpackhi_ps(hi, hi));
    if constexpr (NT > 7) o[7 * os] = _mm_cvtss_f32(_mm_shuffle_ps(hi, hi, 3));
}

// Token t's Q8_K block from two bases and two strides: every address is one x86 addressing
// mode [base + stride * {1,2,4} + disp]. The empty asm hides the arithmetic from GCC's
// induction-variable optimisation, which otherwise keeps a pointer per (token, group) pair
// and spills them.
template <int NT>
struct Tok {
    const uint8_t *p0, *p1;  // token 0's and token 1's block
    size_t s1, s3;           // act_stride, 3 * act_stride
    LB_IQ_INLINE Tok(const uint8_t *y, size_t as) : p0(y), p1(y + as), s1(as), s3(3 * as) {
        if constexpr (NT == 1) __asm__("" : "+r"(p0));
        else if constexpr (NT == 2) __asm__("" : "+r"(p0), "+r"(p1));
        else if constexpr (NT <= 4) __asm__("" : "+r"(p0), "+r"(s1), "+r"(s3));
        else __asm__("" : "+r"(p0), "+r"(p1), "+r"(s1), "+r"(s3));
    }
    template <int T>
    LB_IQ_INLINE const uint8_t *at(size_t off) const {
        if constexpr (T == 0) return p0 + off;
        else if constexpr (T == 1) return (NT == 2 || NT > 4 ? p1 : p0 + s1) + off;
        else if constexpr (T == 2) return p0 + 2 * s1 + off;
        else if constexpr (T == 3) return p0 + s3 + off;
        else if constexpr (T == 4) return p0 + 4 * s1 + off;
        else if constexpr (T == 5) return p1 + 4 * s1 + off;
        else if constexpr (T == 6) return p0 + 2 * s3 + off;
        else return p1 + 2 * s3 + off;
    }
};

// Rows [r0, r1) x NT tokens for format D.
//
// One pass over a block's groups runs all NT tokens, except on the 16-register ymm levels for
// NT > 4: there chunk A decodes each group, keeps it in the per-thread decoded-block buffer
// (L1) and runs tokens 0..3; chunk B reloads the decoded groups and runs tokens 4..NT-1.
// The decode still happens once per block per window, and each token's integer (exact) and
// float steps are the same as in any other window.
template <class D, int NT>
__attribute__((noinline)) void rows_window(const RowArgs &a, int64_t r0, int64_t r1) {
    constexpr bool kSplit = !kManyRegs && NT > 4;
    constexpr bool kS = sign_scheme<D, NT>();
    const int64_t nb = a.n / QK_K;
    const size_t as = a.act_stride;
    Scratch *scr = NT > 1 ? &scratch(a, nb, NT) : nullptr;
    const float *dt = NT > 1 ? scr->d.data() : nullptr;
    Decoded *buf = kSplit ? &scr->blk : nullptr;
    (void)buf;
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t *w = a.w + (size_t)r * a.w_stride;
        __m256 facc = _mm256_setzero_ps();
        float sumf = 0.0f;
        for (int64_t i = 0; i < nb; ++i) {
            prefetch_ahead(w + (size_t)i * D::kBytes, D::kBytes);
            D dec(w + (size_t)i * D::kBytes);
            const uint8_t *y = a.act + (size_t)i * kQ8;  // token 0's block
            const Tok<NT> tk(y, as);
            // Offset scheme: a token's integer starts at -c * sum(scale * q8), from its bsums.
            VY k16 = _mm256_setzero_si256();
            if constexpr (!kS) k16 = dec.k16();
#define LB_INIT(t) VY i##t = NT > t && !kS ? _mm256_madd_epi16(ldy(tk.template at<t>(kQ8Bsums)), k16) : _mm256_setzero_si256();
#define LB_STEP(t)                                                                                                \
    if constexpr (NT > t)                                                                                          \
        i##t = kS ? step(i##t, u, sc, negate(ldy(tk.template at<t>(off)), s)) : step(i##t, u, sc, ldy(tk.template at<t>(off)));
            VY ints;           // lane t: token t's block integer (NT > 1)
            int32_t int0 = 0;  // NT == 1
            if constexpr (!kSplit) {
                LB_IQ_EACH(LB_INIT)
                unroll<8>([&](auto gc) LB_IQ_LAMBDA {
                    constexpr int g = decltype(gc)::value;
                    constexpr size_t off = kQ8Qs + (size_t)g * 32;
                    VY u, sc;
                    SA<D> s;
                    prepare<D, kS, g>(dec, u, s, sc);
                    LB_IQ_EACH(LB_STEP)
                });
                if constexpr (NT == 1) {
                    (void)i1; (void)i2; (void)i3; (void)i4; (void)i5; (void)i6; (void)i7;
                    int0 = hsum8_i32(i0);
                } else if constexpr (NT <= 4) {
                    (void)i4; (void)i5; (void)i6; (void)i7;
                    const VY q = quad(i0, i1, i2, i3);
                    ints = _mm256_add_epi32(q, _mm256_permute2x128_si256(q, q, 0x01));
                } else {
                    ints = octet(quad(i0, i1, i2, i3), quad(i4, i5, i6, i7));
                }
            } else {
#if LB_IQ_LEVEL < 3
                // chunk A: decode, keep, tokens 0..3
                LB_INIT(0) LB_INIT(1) LB_INIT(2) LB_INIT(3)
                unroll<8>([&](auto gc) LB_IQ_LAMBDA {
                    constexpr int g = decltype(gc)::value;
                    constexpr size_t off = kQ8Qs + (size_t)g * 32;
                    VY u, sc;
                    SA<D> s;
                    prepare<D, kS, g>(dec, u, s, sc);
                    _mm256_store_si256(&buf->u[g], u);
                    _mm256_store_si256(&buf->sc[g], sc);
                    if constexpr (kS) _mm256_store_si256(&buf->s[g], s);
                    LB_STEP(0) LB_STEP(1) LB_STEP(2) LB_STEP(3)
                });
                const VY q03 = quad(i0, i1, i2, i3);
                // chunk B: the kept groups, tokens 4..NT-1. Laundering the pointer makes the
                // compiler reload them instead of forwarding chunk A's 16 vectors in registers.
                Decoded *kept = buf;
                __asm__("" : "+r"(kept) : : "memory");
#if defined(__clang__)
                const Tok<NT> tkb = tk;
                Decoded *const keptb = kept;
#endif
                LB_INIT(4) LB_INIT(5) LB_INIT(6) LB_INIT(7)
                unroll<8>([&](auto gc) LB_IQ_LAMBDA {
                    constexpr int g = decltype(gc)::value;
                    constexpr size_t off = kQ8Qs + (size_t)g * 32;
                    // clang schedules up to 4 loads off one base pointer next to each other
                    // (SelectionDAG load clustering): the 4 groups' loads of a token, all held
                    // until used (I7). A fresh base per group (an empty asm) keeps them apart.
#if defined(__clang__)
                    Tok<NT> tk = tkb;
                    Decoded *kept = keptb;
                    __asm__ volatile("" : "+r"(tk.p0), "+r"(tk.p1), "+r"(kept));  // (volatile: not merged)
#endif
                    const VY u = _mm256_load_si256(&kept->u[g]), sc = _mm256_load_si256(&kept->sc[g]);
                    SA<D> s = u;
                    if constexpr (kS) s = _mm256_load_si256(&kept->s[g]);
                    LB_STEP(4) LB_STEP(5) LB_STEP(6) LB_STEP(7)
                });
                ints = octet(q03, quad(i4, i5, i6, i7));
#endif
            }
#undef LB_INIT
#undef LB_STEP
            if constexpr (NT == 1) {
                (void)ints;
                const float dd = dec.dw() * reinterpret_cast<const block_q8_K *>(y)->d;
                float xf = (float)int0;
                if constexpr (D::kPost != 1.0f) xf = D::kPost * xf;
                sumf = sumf + dd * xf;
            } else {
                (void)int0;
                __m256 xf = _mm256_cvtepi32_ps(ints);
                if constexpr (D::kPost != 1.0f) xf = _mm256_mul_ps(kps<fbits(D::kPost)>(), xf);
                const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(dec.dw()), _mm256_loadu_ps(dt + (size_t)i * 8));
                facc = _mm256_add_ps(facc, _mm256_mul_ps(dd, xf));
            }
        }
        float *o = a.out + r;
        if constexpr (NT == 1) {
            o[0] = D::kFinal != 1.0f ? D::kFinal * sumf : sumf;
        } else {
            if constexpr (D::kFinal != 1.0f) facc = _mm256_mul_ps(kps<fbits(D::kFinal)>(), facc);
            store_tokens<NT>(o, a.out_stride, facc);
        }
    }
}

// ---- nt = 1 ----------------------------------------------------------------------------------
// One token: the same exact block integer and the same float steps as rows_window (so the same
// bits, I2), organised for a lone token: the sign scheme, and the integers of two blocks
// reduced together (one transpose-add instead of two horizontal sums); the float steps stay
// scalar-equivalent, in block order.

// Lanes of block (w, y)'s integer for one token (its sum over the lanes is the exact integer).
template <class D>
LB_IQ_INLINE VY block_one(const uint8_t *w, const uint8_t *y) {
    constexpr bool kS = sign_scheme<D, 1>();
    prefetch_ahead(w, D::kBytes);
    D dec(w);
    VY x = _mm256_setzero_si256();
    if constexpr (!kS) x = _mm256_madd_epi16(ldy(y + kQ8Bsums), dec.k16());
    unroll<8>([&](auto gc) LB_IQ_LAMBDA {
        constexpr int g = decltype(gc)::value;
        VY u, sc;
        SA<D> s;
        prepare<D, kS, g>(dec, u, s, sc);
        const VY q = ldy(y + kQ8Qs + 32 * g);
        if constexpr (kS) x = step(x, u, sc, negate(q, s));
        else x = step(x, u, sc, q);
    });
    // Volatile: the block's sum is formed here, not sunk into the two-block reduction.
    __asm__ volatile("" : "+" LB_IQ_VREG_RAW(x));
    return x;
}

template <class D>
__attribute__((noinline)) void rows_one(const RowArgs &a, int64_t r0, int64_t r1) {
    const int64_t nb = a.n / QK_K;
    const auto *y = reinterpret_cast<const block_q8_K *>(a.act);
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t *w = a.w + (size_t)r * a.w_stride;
        float sumf = 0.0f;
        int64_t i = 0;
        for (; i + 2 <= nb; i += 2) {
            const uint8_t *wb = w + (size_t)i * D::kBytes;
            const uint8_t *yb = a.act + (size_t)i * kQ8;
            // two blocks' lanes reduced together: lane 0 = block i, lane 1 = block i + 1 (exact)
            const VY x0 = block_one<D>(wb, yb), x1 = block_one<D>(wb + D::kBytes, yb + kQ8);
            VY t = _mm256_add_epi32(_mm256_unpacklo_epi32(x0, x1), _mm256_unpackhi_epi32(x0, x1));
            t = _mm256_add_epi32(t, _mm256_permute2x128_si256(t, t, 0x01));
            VX t2 = _mm256_castsi256_si128(t);
            t2 = _mm_add_epi32(t2, _mm_unpackhi_epi64(t2, t2));
            __m128 xf = _mm_cvtepi32_ps(t2);
            if constexpr (D::kPost != 1.0f) xf = _mm_mul_ps(_mm_set1_ps(D::kPost), xf);
            const VX halves = _mm_cvtsi32_si128((int)((uint32_t)D::half(wb) | (uint32_t)D::half(wb + D::kBytes) << 16));
            const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(halves), _mm_setr_ps(y[i].d, y[i + 1].d, 0.0f, 0.0f));
            const __m128 p = _mm_mul_ps(dd, xf);
            sumf = sumf + _mm_cvtss_f32(p);
            sumf = sumf + _mm_cvtss_f32(_mm_movehdup_ps(p));
        }
        for (; i < nb; ++i) {
            const uint8_t *wb = w + (size_t)i * D::kBytes;
            float xf = (float)hsum8_i32(block_one<D>(wb, a.act + (size_t)i * kQ8));
            if constexpr (D::kPost != 1.0f) xf = D::kPost * xf;
            sumf = sumf + (_cvtsh_ss(D::half(wb)) * y[i].d) * xf;
        }
        a.out[r] = D::kFinal != 1.0f ? D::kFinal * sumf : sumf;
    }
}

// Windows of 2..8 tokens (rows[2..8]). Building with -DLB_IQ_MEASURE_WINDOW_NT1 registers this
// kernel for nt = 1 as well (how the token-count gate below was measured).
template <class D>
void rows_win(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    switch (nt) {
#ifdef LB_IQ_MEASURE_WINDOW_NT1
        case 1: rows_window<D, 1>(a, r0, r1); break;
#endif
        case 2: rows_window<D, 2>(a, r0, r1); break;
        case 3: rows_window<D, 3>(a, r0, r1); break;
        case 4: rows_window<D, 4>(a, r0, r1); break;
        case 5: rows_window<D, 5>(a, r0, r1); break;
        case 6: rows_window<D, 6>(a, r0, r1); break;
        case 7: rows_window<D, 7>(a, r0, r1); break;
        case 8: rows_window<D, 8>(a, r0, r1); break;
        default: break;
    }
}
// One token (rows[1]).
template <class D>
void rows_nt1(const RowArgs &a, int64_t r0, int64_t r1, int) { rows_one<D>(a, r0, r1); }

template <class D>
void reg(KernelTable &t, int id, const char *win_name, const char *nt1_name) {
    t.set_rows_all(id, rows_win<D>, win_name, LOWBIT_ISA);
#ifndef LB_IQ_MEASURE_WINDOW_NT1
    t.at(id).rows[1] = RowKernel{rows_nt1<D>, nt1_name, LOWBIT_ISA};
#endif
}

}  // namespace

#define LB_STR2(x) #x
#define LB_STR(x) LB_STR2(x)
#define LB_KNAME(fmt) "rows_" fmt "_q8_k_" LB_STR(LOWBIT_NS)
#define LB_KNAME1(fmt) "rows_" fmt "_q8_k_nt1_" LB_STR(LOWBIT_NS)

// Token-count gate: rows[1] = rows_one (the sign scheme, two blocks reduced together), rows[2..8]
// = rows_window. Measured on the CI machine (Xeon, Sapphire Rapids class, 1 pinned thread,
// n = 2560, 1 MB of ggml-quantized rows, min of 50 interleaved runs; us per row):
//   nt = 1       window kernel at nt = 1        rows_one (registered)          ggml vec_dot
//               avx2   avx2vnni avx512         avx2   avx2vnni avx512
//   IQ4_XS      0.118  0.116   0.115          0.111  0.111   0.111          0.114 / 0.118
//   IQ2_XXS     0.183  0.182   0.164          0.173  0.173   0.157          0.195 / 0.199
//   IQ2_XS      0.180  0.176   0.157          0.186  0.170   0.159          0.228 / 0.235
//   IQ3_XXS     0.206  0.202   0.179          0.198  0.195   0.173          0.246 / 0.246
//   IQ3_S       0.222  0.214   0.190          0.219  0.203   0.187          0.347 / 0.359
//   IQ2_S       0.186  0.180   0.161          0.171  0.166   0.143          0.202 / 0.191
//   IQ1_S       0.172  0.167   0.167          0.157  0.151   0.152          0.192 / 0.192
//   IQ1_M       0.219  0.209   0.202          0.205  0.195   0.190          0.211 / 0.198
// (ggml's column: its time in each of the two runs.) rows_one is the faster nt = 1 path for
// every format but IQ2_XS on avx2 (a tie within noise). IQ1_M then decoded from iq1s_grid and
// was at parity with ggml on avx2; with the kIq1mU table (see Iq1m) its rows_one measured
// 0.161 (avx2) and 0.148 (avx512) against 0.224 / 0.203 before, ggml 0.207-0.214 (min of 15
// interleaved runs, 16 MB of rows, a loaded machine).
void register_iquants(KernelTable &t) {
    reg<Iq4xs>(t, T_IQ4_XS, LB_KNAME("iq4_xs"), LB_KNAME1("iq4_xs"));
    reg<Iq2xxs>(t, T_IQ2_XXS, LB_KNAME("iq2_xxs"), LB_KNAME1("iq2_xxs"));
    reg<Iq2xs>(t, T_IQ2_XS, LB_KNAME("iq2_xs"), LB_KNAME1("iq2_xs"));
    if (iq_grid_by_loads()) {
        reg<Iq3xxs<true>>(t, T_IQ3_XXS, LB_KNAME("iq3_xxs"), LB_KNAME1("iq3_xxs"));
        reg<Iq3s<true>>(t, T_IQ3_S, LB_KNAME("iq3_s"), LB_KNAME1("iq3_s"));
    } else {
        reg<Iq3xxs<false>>(t, T_IQ3_XXS, LB_KNAME("iq3_xxs"), LB_KNAME1("iq3_xxs"));
        reg<Iq3s<false>>(t, T_IQ3_S, LB_KNAME("iq3_s"), LB_KNAME1("iq3_s"));
    }
    reg<Iq2s>(t, T_IQ2_S, LB_KNAME("iq2_s"), LB_KNAME1("iq2_s"));
    reg<Iq1s>(t, T_IQ1_S, LB_KNAME("iq1_s"), LB_KNAME1("iq1_s"));
    reg<Iq1m>(t, T_IQ1_M, LB_KNAME("iq1_m"), LB_KNAME1("iq1_m"));
}

}  // namespace LOWBIT_NS
}  // namespace lowbit

