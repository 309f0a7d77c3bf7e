// The GEMM tier: prompt chunks, MoE experts with many routed tokens, large server steps.
// k-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), i-quants (IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S,
// IQ1_M) and ternary TQ2_0, TQ1_0 x Q8_K, legacy Q4_0, Q5_0, Q8_0 x Q8_0 and Q4_1, Q5_1 x Q8_1, I2_S x I8_S.
// Shared body of csrc/x86/{avx2,avx2vnni,avx512,amx}/gemm.cpp (LOWBIT_ISA, LOWBIT_NS; each built
// with its level's flags only; amx: LOWBIT_AMX, the dots from AMX-INT8 tile products, mk_amx,
// mk_amx_legacy and mk_amx_i2s, on avx512's vectors; csrc/x86/avx2/gemm_amx.cpp builds the same on avx2's vectors
// with the tiles emulated, for tests): 16 tokens per zmm with VNNI's vpdpbusd / vpdpwssd (avx512), 8 per
// ymm with AVX-VNNI (avx2vnni), 8 per ymm with vpmaddubsw + vpmaddwd + vpaddd (avx2: exact only
// for codes |w| <= 64, see vdot; Q8_0 there takes the sign trick, vdot_sign). I2_S's GEMM is
// avx512's only (avx2 / avx2vnni keep csrc/x86/ternary.inl's tile-decode GEMM, gated off).
//
// Contract (KernelEntry::gemm, csrc/kernels.h): out[t * out_stride + r] = dot(W[r], act[t])
// for r in [r0, r1) and every t < nt (any nt >= 1), BITWISE the row kernels' result at this
// level (csrc/x86/kquants.inl, GROUPS; I2, I3, I8): per (row, token, super-block) the exact
// integer sums
//   I = sum_s sc[s] * sum_{k in s} w_k * q_k          (w: the codes, Q6_K's less its offset 32)
//   M = sum_s mn[s] * sum_{k in s} q_k                 (MINS formats: Q4_K, Q5_K)
// and then, in super-block order from acc = 0, the same two float steps
//   acc = fma(d * d_a, (float)I, acc);   acc = fnmadd(dmin * d_a, (float)M, acc)
// (IQ4_XS, whose row kernels are the i-quants' (csrc/x86/iquants.inl): acc = acc + (d * d_a) *
// (float)I, a multiply then an add, and I its sub-block scales times their integer dots too; so
// the other i-quants and TQ*, with POST * (float)I for IQ1_* and out = FINAL * acc after the last
// super-block for IQ2_* and IQ3_XXS: see GIQ2XXS's comment)
// (d * d_a and dmin * d_a: one rounding each; float multiplication commutes, so d_a * d is
// the same value). Integer sums are exact whatever their grouping, so only the float steps'
// order binds the layout, and it is per (row, token): any tiling of rows and tokens gives the
// row kernels' bits.
//
// Layout: TOKENS IN LANES. Each 16-token group of the chunk is transposed once per call into
// an activation panel (ActSB per super-block): dword lane l of q[dw] = token l's activation
// bytes 4dw .. 4dw + 3, each plus 128 (so unsigned: vpdpbusd's first operand). Each weight
// row is decoded once per call into codes w (one byte each, natural order: Q4_K / Q5_K's
// u in 0..31; Q6_K's, Q3_K's and IQ4_XS's signed q, vpdpbusd's signed operand) and its super-blocks'
// metadata (RowSB). One vpdpbusd then takes 4 codes of one row (a broadcast dword) times 4
// activations of 16 tokens. The +128 comes back per row and super-block, independent of the
// token:  sum_k (q_k + 128) w_k = sum_k q_k w_k + 128 * W,   C = 128 * sum_s sc[s] * W_s.
// So Q6_K's offset of 32 needs no bsums term (it is in the signed codes, hence in C), and
// only the MINS formats read the activations' block sums (4 vpdpwssd: pairs of 32-sums).
// Q4_K and Q5_K (D::UW) swap the roles instead: their codes u are unsigned already, so the
// broadcast weight dword is vpdpbusd's unsigned operand and the panel keeps the activations
// signed (no +128, C = 0): the tile's decode is a nibble split and a store, without the per
// sub-block code sums C needs (their vpsadbw chains were 12% of an 8B-shaped prefill, perf).
// The integer sums are the same either way, so the results are bitwise unchanged.
// Bounds (int32, exact): a sub-block's |dot| <= 32 * 255 * 32 = 261120; times |sc| <= 128 and
// summed over 8 or 16 sub-blocks: < 2^29. IQ4_XS: |dot| <= 32 * 255 * 127, times |sc| <= 32, over
// 8 sub-blocks: < 2^29 too; its C < 128 * 8 * 32 * 32 * 127 < 2^28.
//
// Microkernel (mk_*): R <= 4 rows x V <= 3 lane vectors (48 tokens; avx2vnni 3 x 1 of 8; avx2 4 x 2
// of 8 for the formats with int16 sums, their I in L1, else 3 x 1: MAXR_KQ's header;
// a pass of one vector at avx512 takes R <= MAXR1 = 8 rows), registers: V activation vectors, R x
// V sub-block dots, R x V super-block sums I (28 of 32 zmm at R = 4, V = 3); the float
// accumulators stay in L1 (one load and store per super-block, re-read after a compiler barrier:
// carried in registers they spilled at V = 3, I7), the mins sums M are formed row by row after the
// sub-block loop. Per super-block and (row, 16 tokens): 64 vpdpbusd + 8 or 16 (vpmulld + vpaddd) +
// 4 vpdpwssd (MINS formats only) + 6 float ops.
//
// Blocking (tile_loop, shared by every GEMM here): a call decodes its rows in tiles of <= 64 rows
// (their codes <= ~256 KB, L2), and runs every pass of <= 3 lane vectors (48 tokens) over each 4-row
// group of the tile; a pass's results reach out[t] as one contiguous run of the tile's rows.
// (GCC 12's avx512 intrinsics trip -Wmaybe-uninitialized in every caller, as in kquants.inl)
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../kernels.h"
#include "../ref/iq_tables.h"
#include "../repack.h"
#include "hsum.h"
#include "prefetch.h"
#if defined(LOWBIT_AMX)
#include "amx_tiles.h"
#endif

#ifndef LOWBIT_ISA
#error "define LOWBIT_ISA and LOWBIT_NS before including gemm_kquants.inl"
#endif
namespace lowbit {
namespace LOWBIT_NS {
namespace {


#define LB_GK_INLINE inline __attribute__((always_inline))

constexpr int QK = 256;     // values per super-block

// ---- the level's vectors: 16 tokens per zmm (avx512) or 8 per ymm (avx2vnni) ----------------
// vdot(acc, a, w): acc + the sums of 4 products of unsigned bytes a and signed bytes w per
// int32 lane (vpdpbusd); vdot16: acc + the int16 pair products (vpdpwssd). At avx2 (no VNNI)
// vdot is vpmaddubsw + vpmaddwd (with ones) + vpaddd, which saturates the int16 sum of a pair
// of products: exact (bitwise vpdpbusd) only while |2 * 255 * w| <= 32767, i.e. |w| <= 64
// (W_MAX below, checked per format: each decoder states its codes' largest magnitude, WMAX).
#if defined(__AVX512F__)
constexpr int LANES = 16;   // tokens per vector
constexpr int MAXR = 4;     // rows per microkernel
// lane vectors per microkernel (its tokens: V x 16). The k-quant and I2_S GEMMs take 3 (their
// 4 x 3 sub-block dots and sums: 24 of 32 zmm); the legacy GEMM takes MAXV_LEG = 2 (its 4 x 3
// spilled under clang). Zen 5, bench kernels --nt 512,48 --n 4096, 4 x 3 against 4 x 2 (builds
// alternated, BENCHMARKS.md round (9)): Q4_K 1.03-1.11x at 512 tokens, 1.0-1.19x at 48; Q6_K
// 1.0-1.04x at 512; I2_S 1.08x at 512, 1.28x at 48; 3 x 3 was 0.8-0.9x of 4 x 3.
constexpr int MAXV = 3;
constexpr int MAXV_LEG = 2;
constexpr int MAXR_KQ = MAXR;  // (the k-quant GEMM's rows in passes of more than one vector)
// rows per microkernel in a pass of ONE lane vector (a chunk of <= 16 tokens, or a chunk's last
// 16): 4 rows x 1 vector are only 4 chains of vpdpbusd, fewer than its latency x issue width
// (Zen 4: 4 x 1, Zen 5: 4 x 2 per cycle), and load a broadcast weight per vpdpbusd; 8 rows x 1
// are 8 chains in 18 zmm. (Measured: BENCHMARKS.md round (11).)
constexpr int MAXR1 = 8;
// a microkernel table [R][V] (R <= MAXR, V <= MAXV; index 0 unused): LB_GK_TABLE(mk_x<D,) is
// {&mk_x<D, R, V>}, LB_GK_TABLE(mk_y<) is {&mk_y<R, V>}; LB_GK_TABLE1 the one-vector passes'
// [R] (R <= MAXR1): {&mk_x<D, R, 1>}
#define LB_GK_TABLE1(...)                                                                                   \
    {nullptr, &__VA_ARGS__ 1, 1>, &__VA_ARGS__ 2, 1>, &__VA_ARGS__ 3, 1>, &__VA_ARGS__ 4, 1>, &__VA_ARGS__ 5, 1>, \
     &__VA_ARGS__ 6, 1>, &__VA_ARGS__ 7, 1>, &__VA_ARGS__ 8, 1>}
#define LB_GK_TABLE(...)                                                                      \
    {{nullptr, nullptr, nullptr, nullptr},                                                             \
     {nullptr, &__VA_ARGS__ 1, 1>, &__VA_ARGS__ 1, 2>, &__VA_ARGS__ 1, 3>}, {nullptr, &__VA_ARGS__ 2, 1>, &__VA_ARGS__ 2, 2>, &__VA_ARGS__ 2, 3>}, \
     {nullptr, &__VA_ARGS__ 3, 1>, &__VA_ARGS__ 3, 2>, &__VA_ARGS__ 3, 3>}, {nullptr, &__VA_ARGS__ 4, 1>, &__VA_ARGS__ 4, 2>, &__VA_ARGS__ 4, 3>}}
#define LB_GK_TABLE_KQ LB_GK_TABLE
using VI = __m512i;
using VF = __m512;
LB_GK_INLINE VI vset1(int32_t x) { return _mm512_set1_epi32(x); }
LB_GK_INLINE VI vld(const void *p) { return _mm512_load_si512(p); }
LB_GK_INLINE void vst(void *p, VI x) { _mm512_store_si512(p, x); }
LB_GK_INLINE VI vdot(VI acc, VI a, VI w) { return _mm512_dpbusd_epi32(acc, a, w); }
LB_GK_INLINE VI vdot16(VI acc, VI a, VI b) { return _mm512_dpwssd_epi32(acc, a, b); }
LB_GK_INLINE VI vadd(VI a, VI b) { return _mm512_add_epi32(a, b); }
LB_GK_INLINE VI vsub(VI a, VI b) { return _mm512_sub_epi32(a, b); }
LB_GK_INLINE VI vmullo(VI a, VI b) { return _mm512_mullo_epi32(a, b); }
LB_GK_INLINE VI vsll3(VI a) { return _mm512_slli_epi32(a, 3); }
LB_GK_INLINE VF fcvt(VI a) { return _mm512_cvtepi32_ps(a); }
LB_GK_INLINE VF fzero() { return _mm512_setzero_ps(); }
LB_GK_INLINE VF fset1(float x) { return _mm512_set1_ps(x); }
LB_GK_INLINE VF fld(const float *p) { return _mm512_load_ps(p); }
LB_GK_INLINE VF fldu(const float *p) { return _mm512_loadu_ps(p); }
LB_GK_INLINE void fst(float *p, VF v) { _mm512_storeu_ps(p, v); }
LB_GK_INLINE VF fadd(VF a, VF b) { return _mm512_add_ps(a, b); }
LB_GK_INLINE VF fmul(VF a, VF b) { return _mm512_mul_ps(a, b); }
LB_GK_INLINE VF fdiv(VF a, VF b) { return _mm512_div_ps(a, b); }
LB_GK_INLINE VF ffma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
LB_GK_INLINE VF ffnma(VF a, VF b, VF c) { return _mm512_fnmadd_ps(a, b, c); }
#else
constexpr int LANES = 8;
// 16 registers: R x V x 3 + V + the weight (avx2: R x 3 sums, int16 p, dt and I, + the
// activations, the weight, ones and a product: 13; 4 rows spilled)
constexpr int MAXR = 3;
#define LB_GK_TABLE(...) \
    {{nullptr, nullptr}, {nullptr, &__VA_ARGS__ 1, 1>}, {nullptr, &__VA_ARGS__ 2, 1>}, {nullptr, &__VA_ARGS__ 3, 1>}}
constexpr int MAXV_LEG = 1;
constexpr int MAXR1 = MAXR;  // rows in a pass of one vector
#define LB_GK_TABLE1(...) {nullptr, &__VA_ARGS__ 1, 1>, &__VA_ARGS__ 2, 1>, &__VA_ARGS__ 3, 1>}
#if defined(__AVXVNNI__) || defined(LOWBIT_AMX)
constexpr int MAXV = 1;  // (every pass is of one vector here)
constexpr int MAXR_KQ = MAXR;
#define LB_GK_TABLE_KQ LB_GK_TABLE
#else
// avx2: the k-quant GEMM (mk_gemm) takes passes of 2 lane vectors (16 tokens) x 4 rows, its
// super-block sums I in L1 (kIL1: 8 int16 sums, 2 activation vectors, the weight and a scale
// in registers). A broadcast weight dword then feeds two vpmaddubsw, not one: a register-only
// loop of the presum16 pattern on Zen 3 ran 1.4x at 4 x 2 and 1.2x at 6 x 1 against 3 x 1
// (GCC 12, one thread; BENCHMARKS.md round (22)). The legacy GEMM's Q4_0 / Q4_1 (leg_pv) and
// I2_S's (mk_gemm_i2s) take the same passes; the other formats keep passes of one vector (kq_pv).
constexpr int MAXV = 2;
constexpr int MAXR_KQ = 4;
#define LB_GK_KQ_V2 1
#define LB_GK_TABLE_KQ(...)                                                                                  \
    {{nullptr, nullptr, nullptr}, {nullptr, &__VA_ARGS__ 1, 1>, &__VA_ARGS__ 1, 2>},                          \
     {nullptr, &__VA_ARGS__ 2, 1>, &__VA_ARGS__ 2, 2>}, {nullptr, &__VA_ARGS__ 3, 1>, &__VA_ARGS__ 3, 2>}, \
     {nullptr, &__VA_ARGS__ 4, 1>, &__VA_ARGS__ 4, 2>}}
#endif
using VI = __m256i;
using VF = __m256;
LB_GK_INLINE VI vset1(int32_t x) { return _mm256_set1_epi32(x); }
LB_GK_INLINE VI vld(const void *p) { return _mm256_load_si256((const __m256i *)p); }
LB_GK_INLINE void vst(void *p, VI x) { _mm256_store_si256((__m256i *)p, x); }
#if defined(__AVXVNNI__)
constexpr int W_MAX = 128;  // vpdpbusd: any signed byte
LB_GK_INLINE VI vdot(VI acc, VI a, VI w) { return _mm256_dpbusd_avx_epi32(acc, a, w); }
LB_GK_INLINE VI vdot16(VI acc, VI a, VI b) { return _mm256_dpwssd_avx_epi32(acc, a, b); }
#else
// avx2: a (0..255) x w: a pair's sum |a0 w0 + a1 w1| <= 2 * 255 * 64 = 32640 <= 32767 for
// |w| <= 64, so vpmaddubsw does not saturate and the sum is vpdpbusd's, exactly.
constexpr int W_MAX = 64;
// (The empty asm fences the sum: GCC would otherwise reassociate a sub-block's chain of vpaddd
// into a tree, forming all its products first: 14 to 56 spilled ymm per microkernel, I7.)
LB_GK_INLINE VI vdot(VI acc, VI a, VI w) {
    VI s = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, w), _mm256_set1_epi16(1)));
    __asm__("" : "+v"(s));
    return s;
}
// vpmaddwd's pair sum wraps only at (-32768)^2 * 2, modulo 2^32 as vpdpwssd's: exact (here
// |bs| <= 4096, |mn| <= 63)
LB_GK_INLINE VI vdot16(VI acc, VI a, VI b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
// The microkernels' inner loop at avx2 for the narrow codes (LB_GK_PRESUM16): the vpmaddubsw
// products of K consecutive dwords summed in int16 lanes (vpaddw), then one vpmaddwd with ones
// into int32. Exact while no int16 sum saturates or wraps: K * 2 * 255 * WMAX <= 32767, so
// K = ksum16(WMAX): Q4_0 (8) 8 dwords, Q4_1 (15) 4; Q6_K (32) would have 2, and takes vdot
// (presum16: K >= 4; at 2 the 3-row microkernels spilled); Q4_K and Q5_K, unsigned codes against
// signed activations (D::UW), ksum16_uw: 8 and 4 dwords (Q5_K: 1.4x its vdot). A quarter to
// an eighth of vdot's vpmaddwd, which Zen 3 issues on the same 2 pipes as vpmaddubsw (Q4_K's
// windows / gemm at 64 tokens: 1.08 with vdot at 4 rows, 1.33 so).
#define LB_GK_PRESUM16 1
constexpr int ksum16(int wmax) { return 32767 / (2 * 255 * wmax); }
constexpr bool presum16(int wmax) { return ksum16(wmax) >= 4; }
// The same with the roles swapped (UW: unsigned weight codes 0..wmax against signed activations,
// |a| <= 128): K * 2 * 128 * WMAX <= 32767 (Q4_K 8 dwords, Q5_K 4)
constexpr int ksum16_uw(int wmax) { return 32767 / (2 * 128 * wmax); }
// A format's dwords of int16 sums per vpmaddwd: unsigned codes against signed activations (D::UW)
// or the +128 activations against signed codes
template <class D>
constexpr int presum_k() { return D::UW ? ksum16_uw(D::WMAX) : ksum16(D::WMAX); }
// The sign trick for codes too wide for vdot (Q8_0's -128..127; LB_GK_SIGN, GQ8_0::SIGN): the
// activations SIGNED in the panel (no +128), the weight as two broadcast dwords, its codes' |w|
// (vpabsb: -128 gives the byte 0x80, i.e. 128 as vpmaddubsw's unsigned operand) and w itself;
//   vdot_sign(acc, a, wabs, w) = acc + vpmaddwd(vpmaddubsw(wabs, vpsignb(a, w)), ones)
// per int32 lane: sum_k |w_k| * sign(a_k, w_k) = sum_k w_k * a_k. A pair of products lies in
// [2 * 128 * -128, 2 * 128 * 127] = [-32768, 32512] for ANY bytes (vpsignb's result is a byte,
// |w| <= 128): vpmaddubsw never saturates, so the int32 sum is exact. It is not the true product
// only where vpsignb wraps, a = -128 against w < 0 (-(-128) is -128 as a byte): the avx2 window
// kernels (csrc/x86/legacy.inl, FQ8_0's kSign) and ggml's AVX2 vec_dot_q8_0_q8_0 use this very
// sequence, so the GEMM is bitwise theirs for every byte. (An activation code is -128 only
// where the quantizer saw NaN or inf: cvt's INT32_MIN saturated, csrc/x86/act.inl.)
#define LB_GK_SIGN 1
// Its microkernel's rows (mk_gemm_legacy: 4 dt + 4 acc + the activation, ones, |w|, w and a
// product: 13 ymm). Zen 3, bench kernels --mb 16, windows / gemm at 64 and 256 tokens: 3 rows
// 1.05, 1.09-1.10; 4 rows 1.05-1.08, 1.13-1.14; 5 rows 1.07-1.09, 1.13-1.14; 6 rows 1.04-1.09, 1.10-1.11.
// The chain vpsignb, vpmaddubsw, vpmaddwd, vpaddd bounds it: a register-only loop of 12 such
// chains ran 66 GMAC/s on Zen 3, the GEMM 49 at 256 tokens, the windows 44.
constexpr int MAXR_SIGN = 4;
static_assert(2 * 128 * 127 <= 32767 && 2 * 128 * -128 >= -32768, "vpmaddubsw's pair of |w| <= 128 x a signed byte");
LB_GK_INLINE VI vdot_sign(VI acc, VI a, VI wabs, VI w) {
    VI s = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(a, w)), _mm256_set1_epi16(1)));
    __asm__("" : "+v"(s));  // as vdot's fence
    return s;
}
// acc[r][v] += the sum over dwords g in [g0, g1) of act_at(v, g) x w_at(r, g), g1 - g0 <= K,
// times mul_at(r) (one int16 factor in both words of every dword: the int16 sums' vpmaddwd
// takes it, exactly: see mk_gemm's scale fold), or times 1 without mul_at
// (vdots16f: the same with fold(r, v, x) taking each int32 result x in place of acc's add)
template <int R, int V, bool UW = false, class ActAt, class WAt, class MulAt, class Fold>
LB_GK_INLINE void vdots16f(int g0, int g1, ActAt act_at, WAt w_at, MulAt mul_at, Fold fold) {
    VI p[R][V];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
        #pragma GCC unroll 16
        for (int v = 0; v < V; ++v) p[r][v] = _mm256_setzero_si256();
    #pragma GCC unroll 16
    for (int g = g0; g < g1; ++g) {
        VI a[V];
        #pragma GCC unroll 16
        for (int v = 0; v < V; ++v) {
            VI x = act_at(v, g);
            __asm__("" : "+v"(x));  // loaded here, not hoisted over the group (spills, I7)
            a[v] = x;
        }
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const VI w = vset1(w_at(r, g));
            #pragma GCC unroll 16
            for (int v = 0; v < V; ++v) {
                const VI t = UW ? _mm256_maddubs_epi16(w, a[v]) : _mm256_maddubs_epi16(a[v], w);
                VI x = _mm256_add_epi16(p[r][v], t);
                __asm__("" : "+v"(x));  // in order (as vdot's fence; on a scalar: an array element
                p[r][v] = x;            // in an asm keeps the array in memory)
            }
        }
#if defined(__clang__)
        // the next dword's loads wait for this one's sums (as mk_gemm's: clang loaded 4 dwords'
        // activations ahead and spilled 2 of them in I2_S's 32-dword groups at 4 x 2)
        __asm__ volatile("" : : "v"(p[R - 1][V - 1]) : "memory");
#endif
    }
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        const VI m = mul_at(r);
        #pragma GCC unroll 16
        for (int v = 0; v < V; ++v) fold(r, v, _mm256_madd_epi16(p[r][v], m));
    }
}
template <int R, int V, bool UW = false, class ActAt, class WAt, class MulAt>
LB_GK_INLINE void vdots16(VI (&acc)[R][V], int g0, int g1, ActAt act_at, WAt w_at, MulAt mul_at) {
    vdots16f<R, V, UW>(g0, g1, act_at, w_at, mul_at, [&](int r, int v, VI x) { acc[r][v] = _mm256_add_epi32(acc[r][v], x); });
}
template <int R, int V, bool UW = false, class ActAt, class WAt>
LB_GK_INLINE void vdots16(VI (&acc)[R][V], int g0, int g1, ActAt act_at, WAt w_at) {
    vdots16<R, V, UW>(acc, g0, g1, act_at, w_at, [](int) { return _mm256_set1_epi16(1); });
}
#endif
LB_GK_INLINE VI vadd(VI a, VI b) { return _mm256_add_epi32(a, b); }
LB_GK_INLINE VI vsub(VI a, VI b) { return _mm256_sub_epi32(a, b); }
LB_GK_INLINE VI vmullo(VI a, VI b) { return _mm256_mullo_epi32(a, b); }
LB_GK_INLINE VI vsll3(VI a) { return _mm256_slli_epi32(a, 3); }
LB_GK_INLINE VF fcvt(VI a) { return _mm256_cvtepi32_ps(a); }
LB_GK_INLINE VF fzero() { return _mm256_setzero_ps(); }
LB_GK_INLINE VF fset1(float x) { return _mm256_set1_ps(x); }
LB_GK_INLINE VF fld(const float *p) { return _mm256_load_ps(p); }
LB_GK_INLINE VF fldu(const float *p) { return _mm256_loadu_ps(p); }
LB_GK_INLINE void fst(float *p, VF v) { _mm256_storeu_ps(p, v); }
LB_GK_INLINE VF fadd(VF a, VF b) { return _mm256_add_ps(a, b); }
LB_GK_INLINE VF fmul(VF a, VF b) { return _mm256_mul_ps(a, b); }
LB_GK_INLINE VF fdiv(VF a, VF b) { return _mm256_div_ps(a, b); }
LB_GK_INLINE VF ffma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
LB_GK_INLINE VF ffnma(VF a, VF b, VF c) { return _mm256_fnmadd_ps(a, b, c); }
#endif
#if defined(__AVX512F__)
#if !defined(__AVX512VNNI__)
#error "gemm.inl at avx512 needs AVX512-VNNI"
#endif
constexpr int W_MAX = 128;  // vpdpbusd: any signed byte
#endif
#if !defined(LB_GK_SIGN)
constexpr int MAXR_SIGN = MAXR;  // (no sign trick at this level)
#endif
// The k-quant GEMM's lane vectors per pass for format D, and whether an R x V microkernel keeps
// its super-block sums I in L1 (mk_gemm's kIL1): at avx2 (MAXR_KQ's header) 2 for the presum16
// formats (their K dwords of int16 sums), with I in L1 beyond MAXR1 x 1; elsewhere MAXV, in registers
#if defined(LB_GK_KQ_V2)
template <class D>
constexpr int kq_pv() { return presum_k<D>() >= 4 ? MAXV : 1; }
constexpr bool kq_il1(int R, int V) { return R * V > MAXR1; }
#else
template <class D>
constexpr int kq_pv() { return MAXV; }
constexpr bool kq_il1(int, int) { return false; }
#endif
// Q4_1 / Q5_1 (unsigned codes 0..WMAX; their min term comes through s_a, not the dots) at avx2:
// the codes are vpmaddubsw's UNSIGNED operand and the activations, kept signed in the panel (no
// +128, so no correction), its signed one (D::UW, vdots16's UW): a pair of products is at most
// 2 * WMAX * 128, so the int16 sums hold ksum16_uw(WMAX) dwords, Q4_1 all 8 of a block (one
// vpmaddwd per block and no -128 * sum(w) start, against two and one with the +128 activations),
// Q5_1 4 (it had vdot's vpmaddwd per dword). The integer is the same, so the results are.
#if defined(LB_GK_PRESUM16)
constexpr bool kUnsignedCodes = true;
// rows per microkernel (kMr): a block's int16 sums in one go (Q4_1) leave no int32 sum to keep
constexpr int MAXR_UW = 6;
constexpr int uw_rows(int wmax) { return ksum16_uw(wmax) >= 8 ? MAXR_UW : 4; }
// Q4_0 (+128 activations, signed codes): its int16 sums take a whole block too, and its
// -128 * sum(w) is added after them (kNegLast), so no int32 sum is kept across the block: 5 rows
constexpr int MAXR_NEGLAST = 5;
template <class D>
constexpr bool kNegLast = !D::SIGN && !D::UW && ksum16(D::WMAX) >= 8;
#else
constexpr bool kUnsignedCodes = false;
constexpr int MAXR_UW = MAXR, MAXR_NEGLAST = MAXR;
constexpr int uw_rows(int) { return MAXR; }
template <class D>
constexpr bool kNegLast = false;
#endif
constexpr size_t Q8K_D = 0, Q8K_QS = 4, Q8K_BS = 260;
static_assert(sizeof(block_q8_K) == 292, "q8_K layout");

// One 16-token group's activations of one super-block; NP pairs of activation sums: 4 of 32-sums
// (Q4_K, Q5_K: mins per 32 codes), 8 of 16-sums (Q2_K: mins per 16; D::BS16).
template <int NP>
struct alignas(64) ActSBT {
    uint8_t q[64][LANES * 4];  // [dword dw][lane l * 4 + k]: token l's q[4 dw + k] + 128 (D::UW: q)
    int32_t bs[NP][LANES];     // [pair p][lane]: int16 (s[2p], s[2p + 1]) of token l, s[j] the sum of
                               // its q of sub-block j: NP = 4, 32 q (bsums[2j] + bsums[2j + 1], |s| <=
                               // 4096); NP = 8, 16 q (bsums[j], |s| <= 2048)
    float d[LANES];            // [lane]: token l's d_a (0 for lanes past the chunk)
};
using ActSB = ActSBT<4>;
// One row's super-block metadata (the codes are apart: 256 bytes per super-block).
struct alignas(64) RowSB {
    int32_t sc[16];      // sub-block scales (8 of 32 codes: Q4_K, Q5_K; 16 of 16: Q6_K)
    int32_t mn[8];       // MINS: int16 pairs (mn[2p], mn[2p + 1]) against the activations' bs[p]
                         // (4 pairs of 32-code mins; Q2_K 8 of 16-code mins)
    int32_t C;           // 128 * sum_s sc[s] * W_s (the +128 of the activations; 0 for D::UW)
    float d, dmin;
};

LB_GK_INLINE float f16(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
LB_GK_INLINE int32_t pair16(int a, int b) { return (int32_t)(((uint32_t)(uint16_t)(int16_t)b << 16) | (uint16_t)(int16_t)a); }


// Sum of 32 signed bytes (two halves of a legacy block's decoded codes)
LB_GK_INLINE int32_t wsum32(__m128i lo, __m128i hi) {
    const __m256i x = _mm256_cvtepi8_epi16(lo), y = _mm256_cvtepi8_epi16(hi);
    return hsum8_i32(_mm256_madd_epi16(_mm256_add_epi16(x, y), _mm256_set1_epi16(1)));
}

// Q4_K / Q5_K 6-bit scales and mins (ggml's scale_min_k4) into a RowSB: sc[0..7] as int32 and
// the mins as int16 pairs mn[p] = (mn[2p], mn[2p + 1]), from the 12 bytes q as three 32-bit
// words (byte j of each word is one sub-block's):
//   sc[j] = q[j] & 63,  sc[4 + j] = (q[8 + j] & 15) | (q[j] >> 6) << 4           (j < 4)
//   mn[j] = q[4 + j] & 63,  mn[4 + j] = (q[8 + j] >> 4) | (q[4 + j] >> 6) << 4
// (per byte lane of the words; the masks keep each byte's bits from its neighbours'). Scalar,
// one value at a time, this was most of a tile decode's instructions: 10% of a 30B-A3B-shaped
// prefill's samples, whose experts see ~32 tokens each.
LB_GK_INLINE void scales_mins_k4(const uint8_t *q, RowSB &m) {
    uint32_t w[3];
    std::memcpy(w, q, 12);
    constexpr uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    const __m128i b = _mm_setr_epi32((int)(w[0] & m6), (int)((w[2] & m4) | ((w[0] >> 6) & m2) << 4),  // sc
                                     (int)(w[1] & m6), (int)(((w[2] >> 4) & m4) | ((w[1] >> 6) & m2) << 4));  // mn
    _mm256_storeu_si256((__m256i *)m.sc, _mm256_cvtepu8_epi32(b));
    _mm_storeu_si128((__m128i *)m.mn, _mm_cvtepu8_epi16(_mm_srli_si128(b, 8)));
}

// ---- decoders: one super-block of one row -> 256 codes u (natural order) + RowSB ----------
// Q4_K (144 bytes: fp16 d, dmin; 12 bytes of scales/mins; qs[128]): byte qs[32c + l] holds
// weight 64c + l (low nibble) and 64c + 32 + l (high nibble).
struct GQ4K {
    static constexpr int NSUB = 8;
    static constexpr bool MINS = true;
    static constexpr bool UW = true;  // unsigned codes x signed activations: no +128, no C
    static constexpr int WMAX = 15;  // codes u: 0..15
    static constexpr int SCMAX = 63;  // sub-block scales: 6 bits (the amx level's scaled codes)
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        scales_mins_k4(x + 4, m);
        const __m256i k0F = _mm256_set1_epi8(0x0F);
        for (int c = 0; c < 4; ++c) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x + 16 + 32 * c));
            _mm256_storeu_si256((__m256i *)(u + 64 * c), _mm256_and_si256(q, k0F));
            _mm256_storeu_si256((__m256i *)(u + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(q, 4), k0F));
        }
        m.C = 0;
        m.d = f16(x), m.dmin = f16(x + 2);
    }
};
// Q5_K (176 bytes: d, dmin, scales as Q4_K, qh[32], qs[128]): bit 4 of weight 32s + l is bit
// s of qh[l].
struct GQ5K {
    static constexpr int NSUB = 8;
    static constexpr bool MINS = true;
    static constexpr bool UW = true;
    static constexpr int WMAX = 31;  // codes u: 0..31
    static constexpr int SCMAX = 63;
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        scales_mins_k4(x + 4, m);
        const __m256i k0F = _mm256_set1_epi8(0x0F), k10 = _mm256_set1_epi8(0x10);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(x + 16));
        for (int c = 0; c < 4; ++c) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x + 48 + 32 * c));
            // bit 2c of qh to bit 4 (low), bit 2c + 1 to bit 4 (high)
            const __m256i hl = _mm256_and_si256(2 * c <= 4 ? _mm256_slli_epi16(qh, 4 - 2 * c) : _mm256_srli_epi16(qh, 2 * c - 4), k10);
            const __m256i hh = _mm256_and_si256(2 * c + 1 <= 4 ? _mm256_slli_epi16(qh, 3 - 2 * c) : _mm256_srli_epi16(qh, 2 * c - 3), k10);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, k0F), hl);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), k0F), hh);
            _mm256_storeu_si256((__m256i *)(u + 64 * c), lo);
            _mm256_storeu_si256((__m256i *)(u + 64 * c + 32), hi);
        }
        m.C = 0;
        m.d = f16(x), m.dmin = f16(x + 2);
    }
};
// Q6_K (210 bytes: ql[128], qh[64], int8 scales[16], fp16 d): half h (128 weights; ql + 64h,
// qh + 32h), l < 32: weight 128h + l = ql[l] & 15 | (qh[l] & 3) << 4, + 32: ql[32 + l] & 15 |
// (qh[l] >> 2 & 3) << 4, + 64: ql[l] >> 4 | (qh[l] >> 4 & 3) << 4, + 96: ql[32 + l] >> 4 |
// (qh[l] >> 6) << 4; u = q + 32 in 0..63, stored as the signed code q = u - 32.
struct GQ6K {
    static constexpr int NSUB = 16;
    static constexpr bool MINS = false;
    static constexpr bool UW = false;  // signed codes x activations + 128, C
    static constexpr int WMAX = 32;  // codes q: -32..31
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        // C = 128 * sum_j sc[j] * W_j, W_j = U_j - 512 (U_j: the sum of sub-block j's 16 codes
        // u): sum_j sc[j] U_j as one dot of the codes u against their sub-block's scale (a byte
        // each: vpmaddubsw's pairs <= 2 * 63 * 128, then vpmaddwd with ones), less 512 sum_j sc[j]
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(x + 192));
        const __m256i sc2 = _mm256_broadcastsi128_si256(sc8);
        const __m256i k0F = _mm256_set1_epi8(0x0F), k30 = _mm256_set1_epi8(0x30), k20 = _mm256_set1_epi8(0x20);
        const __m256i ones16 = _mm256_set1_epi16(1);
        __m256i cs = _mm256_setzero_si256();
        for (int h = 0; h < 2; ++h) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x + 128 + 32 * h));
            const __m256i v0 = _mm256_or_si256(_mm256_and_si256(l0, k0F), _mm256_and_si256(_mm256_slli_epi16(qh, 4), k30));
            const __m256i v1 = _mm256_or_si256(_mm256_and_si256(l1, k0F), _mm256_and_si256(_mm256_slli_epi16(qh, 2), k30));
            const __m256i v2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), k0F), _mm256_and_si256(qh, k30));
            const __m256i v3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), k0F),
                                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), k30));
            uint8_t *o = u + 128 * h;
            _mm256_storeu_si256((__m256i *)(o), _mm256_sub_epi8(v0, k20));
            _mm256_storeu_si256((__m256i *)(o + 32), _mm256_sub_epi8(v1, k20));
            _mm256_storeu_si256((__m256i *)(o + 64), _mm256_sub_epi8(v2, k20));
            _mm256_storeu_si256((__m256i *)(o + 96), _mm256_sub_epi8(v3, k20));
            const __m256i v[4] = {v0, v1, v2, v3};
            for (int c = 0; c < 4; ++c) {  // v[c]: sub-blocks j = 8h + 2c (bytes 0..15), j + 1
                const int j = 8 * h + 2 * c;
                const __m256i sj = _mm256_shuffle_epi8(
                    sc2, _mm256_setr_m128i(_mm_set1_epi8((char)j), _mm_set1_epi8((char)(j + 1))));
                cs = _mm256_add_epi32(cs, _mm256_madd_epi16(_mm256_maddubs_epi16(v[c], sj), ones16));
            }
        }
        const __m256i scl = _mm256_cvtepi8_epi32(sc8), sch = _mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8));
        _mm256_storeu_si256((__m256i *)m.sc, scl);
        _mm256_storeu_si256((__m256i *)(m.sc + 8), sch);
        // |sum sc U| <= 16 * 128 * 1008, |512 sum sc| <= 2^20: int32; times 128 < 2^31 (bounds above)
        m.C = 128 * (hsum8_i32(cs) - 512 * hsum8_i32(_mm256_add_epi32(scl, sch)));
        m.d = f16(x + 208), m.dmin = 0.0f;
    }
};

// Q2_K (84 bytes: scales[16], qs[64], fp16 d, dmin; csrc/ref/kquants.cpp unpack_q2_K): weight 128h +
// 32k + l is bits 2k+1:2k of qs[32h + l], an unsigned code 0..3 (D::UW, as Q4_K's); 16 sub-blocks of
// 16, scales[s] its scale (low nibble) and min (high nibble). Its mins are per 16 codes: the panel
// carries 8 pairs of 16-sums (BS16).
struct GQ2K {
    static constexpr int NSUB = 16;
    static constexpr bool MINS = true;
    static constexpr bool UW = true;
    static constexpr bool BS16 = true;
    static constexpr int WMAX = 3;  // codes u: 0..3
    static constexpr int SCMAX = 15;  // scales: 4 bits
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x), k0F = _mm_set1_epi8(0x0F);
        _mm256_storeu_si256((__m256i *)m.sc, _mm256_cvtepu8_epi32(_mm_and_si128(s8, k0F)));
        _mm256_storeu_si256((__m256i *)(m.sc + 8), _mm256_cvtepu8_epi32(_mm_srli_si128(_mm_and_si128(s8, k0F), 8)));
        // mins as int16 pairs: the 16 high nibbles widened to int16 lanes are mn[0..15] in order
        _mm256_storeu_si256((__m256i *)m.mn, _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), k0F)));
        const __m256i k03 = _mm256_set1_epi8(0x03);
        for (int h = 0; h < 2; ++h) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x + 16 + 32 * h));
            for (int k = 0; k < 4; ++k)
                _mm256_storeu_si256((__m256i *)(u + 128 * h + 32 * k), _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), k03));
        }
        m.C = 0;
        m.d = f16(x + 80), m.dmin = f16(x + 82);
    }
};
// Q3_K (110 bytes: hmask[32], qs[64], scales[12], fp16 d; csrc/ref/kquants.cpp unpack_q3_K): weight
// 128h + 32k + l has its low 2 bits at qs[32h + l] bits 2k+1:2k and its third bit at hmask[l] bit
// 4h + k (clear: minus 4), q in -4..3, stored as the signed code; 16 sub-blocks of 16 under 6-bit
// scales less 32 (int8, -32..31). No mins: as Q6_K, the signed codes against activations + 128,
// and C = 128 * sum_s sc[s] * W_s.
struct GQ3K {
    static constexpr int NSUB = 16;
    static constexpr bool MINS = false;
    static constexpr bool UW = false;
    static constexpr int WMAX = 4;  // codes q: -4..3
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        // the scales as ggml's aux words: byte j of word w is sub-block 4w + j's 6 bits
        uint32_t a[3];
        std::memcpy(a, x + 96, 12);
        constexpr uint32_t m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
        const __m128i sc8 = _mm_sub_epi8(
            _mm_setr_epi32((int)((a[0] & m4) | (a[2] & m2) << 4), (int)((a[1] & m4) | ((a[2] >> 2) & m2) << 4),
                           (int)(((a[0] >> 4) & m4) | ((a[2] >> 4) & m2) << 4),
                           (int)(((a[1] >> 4) & m4) | ((a[2] >> 6) & m2) << 4)),
            _mm_set1_epi8(32));
        const __m256i sc2 = _mm256_broadcastsi128_si256(sc8);
        const __m256i k03 = _mm256_set1_epi8(0x03), k04 = _mm256_set1_epi8(0x04), ones16 = _mm256_set1_epi16(1);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x);
        // sum_s sc[s] U_s (U_s: the sum of sub-block s's unsigned codes u = q + 4 in 0..7): vpmaddubsw
        // pairs <= 2 * 7 * 32, then vpmaddwd with ones
        __m256i cs = _mm256_setzero_si256();
        for (int h = 0; h < 2; ++h) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x + 32 + 32 * h));
            for (int k = 0; k < 4; ++k) {
                const int b = 4 * h + k;  // hmask bit, to bit 2 of each byte (shifts within a byte's bits)
                const __m256i hb = b >= 2 ? _mm256_srli_epi16(hm, b - 2) : _mm256_slli_epi16(hm, 2 - b);
                const __m256i v = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * k), k03),
                                                  _mm256_and_si256(hb, k04));
                _mm256_storeu_si256((__m256i *)(u + 128 * h + 32 * k), _mm256_sub_epi8(v, k04));
                const int j = 8 * h + 2 * k;  // bytes 0..15: sub-block j, 16..31: j + 1
                const __m256i sj = _mm256_shuffle_epi8(sc2, _mm256_setr_m128i(_mm_set1_epi8((char)j), _mm_set1_epi8((char)(j + 1))));
                cs = _mm256_add_epi32(cs, _mm256_madd_epi16(_mm256_maddubs_epi16(v, sj), ones16));
            }
        }
        const __m256i scl = _mm256_cvtepi8_epi32(sc8), sch = _mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8));
        _mm256_storeu_si256((__m256i *)m.sc, scl);
        _mm256_storeu_si256((__m256i *)(m.sc + 8), sch);
        // W_s = U_s - 64: |sum sc U| <= 16 * 32 * 112, times 128: int32
        m.C = 128 * (hsum8_i32(cs) - 64 * hsum8_i32(_mm256_add_epi32(scl, sch)));
        m.d = f16(x + 108), m.dmin = 0.0f;
    }
};
// IQ4_XS (136 bytes: fp16 d, scales_h (uint16), scales_l[4], qs[128]; csrc/ref/iquants.cpp):
// sub-block s (32 weights) has qs[16s + j]'s low nibble as weight j and its high nibble as weight
// 16 + j, each indexing kvalues_iq4nl (-127..113: the signed code), and the scale ((scales_l[s / 2]
// >> 4 (s % 2)) & 15 | ((scales_h >> 2s) & 3) << 4) - 32. Its row kernels' float step is the
// i-quants' (csrc/x86/iquants.inl): acc = acc + (d * d_a) * (float)I, no fma (FMA = false), and
// no constant after the last block (kFinal 1). The codes need vdot's full signed byte: not at avx2.
struct GIQ4XS {
    static constexpr int NSUB = 8;
    static constexpr bool MINS = false;
    static constexpr bool UW = false;
    static constexpr bool FMA = false;
    static constexpr int WMAX = 127;  // codes: kvalues_iq4nl, -127..113
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq::kvalues_iq4nl));
        const __m256i k0F = _mm256_set1_epi8(0x0F);
        const __m256i x80 = _mm256_set1_epi8((char)0x80);
        uint16_t sh;
        std::memcpy(&sh, x + 2, 2);
        int32_t csum = 0;
        for (int p = 0; p < 4; ++p) {  // sub-blocks 2p, 2p + 1 from one 32-byte load
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x + 8 + 32 * p));
            const __m256i lo = _mm256_shuffle_epi8(tab, _mm256_and_si256(q, k0F));
            const __m256i hi = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(q, 4), k0F));
            const __m256i s0 = _mm256_permute2x128_si256(lo, hi, 0x20), s1 = _mm256_permute2x128_si256(lo, hi, 0x31);
            _mm256_storeu_si256((__m256i *)(u + 64 * p), s0);
            _mm256_storeu_si256((__m256i *)(u + 64 * p + 32), s1);
            for (int h = 0; h < 2; ++h) {
                const int sb = 2 * p + h;
                const int sc = (((x[4 + sb / 2] >> (4 * (sb % 2))) & 15) | ((sh >> (2 * sb)) & 3) << 4) - 32;
                // W = sum of the 32 codes: vpsadbw of code + 128, less 32 * 128
                const __m256i t = _mm256_sad_epu8(_mm256_xor_si256(h ? s1 : s0, x80), _mm256_setzero_si256());
                const int32_t w = (int32_t)(_mm256_extract_epi64(t, 0) + _mm256_extract_epi64(t, 1) +
                                            _mm256_extract_epi64(t, 2) + _mm256_extract_epi64(t, 3)) - 4096;
                m.sc[sb] = sc;
                csum += sc * w;  // |sc W| <= 32 * 32 * 127, 8 of them
            }
        }
        m.C = 128 * csum;  // < 2^31: 128 * 8 * 32 * 4064
        m.d = f16(x), m.dmin = 0.0f;
    }
};
// ---- the grid i-quants, the ternary formats and IQ1_* (x Q8_K; row kernels csrc/x86/iquants.inl,
// csrc/x86/ternary.inl). Their row kernels' arithmetic per block and token: an exact integer X =
// sum over sub-blocks of (integer sub-block scale) * (sum of code * q_a), then
//   acc = acc + (d * d_a) * (POST * (float)X)      (no fma: FMA = false; POST only where != 1)
// and after the last block out = FINAL * acc (csrc/x86/iquants.inl's kPost, kFinal; the ternary
// formats' sumf + (float)S * (d_a * d), the same value: float multiplication commutes). Here each
// weight becomes ONE signed code (grid value times its sign; IQ1_*: 8 * grid + the delta's sign;
// TQ*: trit - 1) under integer sub-block scales, so X = sum_s sc[s] * sum_{k in s} code_k * q_k is
// the row kernels' integer exactly (theirs by offsets and the Q8_K bsums: the same integer, the
// bsums being the sums of the q). All scales are positive (2 s + 1, or 1), so C comes from one
// vpmaddubsw of the scale bytes (unsigned) against the codes: see codes_C.
// Bounds (int32, exact): |code| <= WMAX <= 62, |sc| <= 31, activations + 128 <= 255: a block's
// |sum_s sc[s] * dot_s| <= 256 * 255 * 62 * 31 < 2^27, C <= 128 * 256 * 62 * 31 < 2^26.
// Codes |w| <= 64 everywhere (IQ3_XXS's grid reaches 62): every level's vdot is exact, avx2's too.

// Scale of every code of a 32-code chunk c as bytes (NSUB 8: one per chunk; 16: two halves)
template <int NSUB>
LB_GK_INLINE __m256i chunk_scales(const RowSB &m, int c) {
    if constexpr (NSUB == 8) return _mm256_set1_epi8((char)m.sc[c]);
    else return _mm256_setr_m128i(_mm_set1_epi8((char)m.sc[2 * c]), _mm_set1_epi8((char)m.sc[2 * c + 1]));
}
// C = 128 * sum_s sc[s] * W_s of a super-block's 256 signed codes u under scales 0 < sc <= 127:
// vpmaddubsw pairs of (sc, code) <= 2 * 127 * 62 < 32767, then vpmaddwd with ones.
template <int NSUB>
LB_GK_INLINE void codes_C(const uint8_t *u, RowSB &m) {
    __m256i cs = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c)
        cs = _mm256_add_epi32(cs, _mm256_madd_epi16(_mm256_maddubs_epi16(chunk_scales<NSUB>(m, c),
                                                                         _mm256_loadu_si256((const __m256i *)(u + 32 * c))),
                                                    _mm256_set1_epi16(1)));
    m.C = 128 * hsum8_i32(cs);
}
// 32 grid magnitudes g (qword l: weights 8l .. 8l + 7) under their 4 sign bytes s (byte l, bit j
// set: weight 8l + j negative) -> 32 signed codes: (g ^ m) - m, m = 0xff where the bit is set.
LB_GK_INLINE __m256i signed_grid32(__m256i g, uint32_t s) {
    const __m256i sb = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s), _mm256_setr_epi64x(0, 0x0101010101010101LL,
                                                                                          0x0202020202020202LL, 0x0303030303030303LL));
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i m = _mm256_cmpeq_epi8(_mm256_and_si256(sb, sel), sel);
    return _mm256_sub_epi8(_mm256_xor_si256(g, m), m);
}
// The 4 full sign bytes of an aux word's 4 x 7 sign bits (bits 7l .. 7l + 6; the 8th: parity)
LB_GK_INLINE uint32_t ksigns4(uint32_t aux) {
    return (uint32_t)iq::ksigns_iq2xs[aux & 127] | (uint32_t)iq::ksigns_iq2xs[(aux >> 7) & 127] << 8 |
           (uint32_t)iq::ksigns_iq2xs[(aux >> 14) & 127] << 16 | (uint32_t)iq::ksigns_iq2xs[(aux >> 21) & 127] << 24;
}
LB_GK_INLINE uint32_t ld32(const uint8_t *p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
LB_GK_INLINE uint16_t ld16(const uint8_t *p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
// 8 rows of a 4-byte grid (32 weights) and 4 rows of an 8-byte grid
template <class Idx>
LB_GK_INLINE __m256i grid8x4(const uint32_t *tab, Idx idx) {
    return _mm256_setr_epi32((int)tab[idx(0)], (int)tab[idx(1)], (int)tab[idx(2)], (int)tab[idx(3)], (int)tab[idx(4)],
                             (int)tab[idx(5)], (int)tab[idx(6)], (int)tab[idx(7)]);
}
template <class Idx>
LB_GK_INLINE __m256i grid4x8(const uint64_t *tab, Idx idx) {
    return _mm256_setr_epi64x((long long)tab[idx(0)], (long long)tab[idx(1)], (long long)tab[idx(2)], (long long)tab[idx(3)]);
}
// A grid's largest magnitude (a byte of any row), for the WMAX of each decoder
template <class T, size_t N>
constexpr int grid_wmax(const T (&g)[N]) {
    int m = 0;
    for (size_t i = 0; i < N; ++i)
        for (size_t j = 0; j < sizeof(T); ++j) m = std::max(m, (int)((g[i] >> (8 * j)) & 0xff));
    return m;
}

// IQ2_XXS (66 bytes: fp16 d; per 32 weights 8 bytes: 4 indices into iq2xxs_grid (8 weights each),
// then an aux word: bits 7l .. 7l + 6 the sign bits of 8-group l, bits 28..31 the scale s): 8
// sub-blocks of 32 under 2 s + 1; FINAL 0.125.
struct GIQ2XXS {
    static constexpr int NSUB = 8;
    static constexpr bool MINS = false, UW = false, FMA = false;
    static constexpr float FINAL = 0.125f;
    static constexpr int WMAX = grid_wmax(iq::iq2xxs_grid);  // 43
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        for (int g = 0; g < 8; ++g) {
            const uint8_t *q = x + 2 + 8 * g;
            const uint32_t aux = ld32(q + 4);
            _mm256_storeu_si256((__m256i *)(u + 32 * g),
                                signed_grid32(grid4x8(iq::iq2xxs_grid, [q](int l) { return q[l]; }), ksigns4(aux)));
            m.sc[g] = 2 * (int32_t)(aux >> 28) + 1;
        }
        codes_C<8>(u, m);
        m.d = f16(x), m.dmin = 0.0f;
    }
};
// IQ2_XS (74 bytes: fp16 d, uint16 qs[32]: per 8 weights a 9-bit iq2xs_grid index and 7 sign bits,
// scales[8]: per 32 weights two nibbles, low for its first 16): 16 sub-blocks of 16; FINAL 0.125.
struct GIQ2XS {
    static constexpr int NSUB = 16;
    static constexpr bool MINS = false, UW = false, FMA = false;
    static constexpr float FINAL = 0.125f;
    static constexpr int WMAX = grid_wmax(iq::iq2xs_grid);  // 43
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        for (int g = 0; g < 8; ++g) {
            const uint8_t *q = x + 2 + 8 * g;
            uint32_t s = 0;
            for (int l = 0; l < 4; ++l) s |= (uint32_t)iq::ksigns_iq2xs[ld16(q + 2 * l) >> 9] << (8 * l);
            _mm256_storeu_si256((__m256i *)(u + 32 * g),
                                signed_grid32(grid4x8(iq::iq2xs_grid, [q](int l) { return ld16(q + 2 * l) & 511; }), s));
            m.sc[2 * g] = 2 * (x[66 + g] & 15) + 1;
            m.sc[2 * g + 1] = 2 * (x[66 + g] >> 4) + 1;
        }
        codes_C<16>(u, m);
        m.d = f16(x), m.dmin = 0.0f;
    }
};
// IQ2_S (82 bytes: fp16 d, qs[32] the low 8 bits of a 10-bit iq2s_grid index per 8 weights, then
// 32 explicit sign bytes, qh[8] (bits 2l, 2l + 1: index bits 8, 9 of 8-group l), scales[8] as
// IQ2_XS's): 16 sub-blocks of 16; FINAL 0.125.
struct GIQ2S {
    static constexpr int NSUB = 16;
    static constexpr bool MINS = false, UW = false, FMA = false;
    static constexpr float FINAL = 0.125f;
    static constexpr int WMAX = grid_wmax(iq::iq2s_grid);  // 43
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        for (int g = 0; g < 8; ++g) {
            const uint8_t *q = x + 2 + 4 * g;
            const uint32_t qh = x[66 + g];
            _mm256_storeu_si256((__m256i *)(u + 32 * g),
                                signed_grid32(grid4x8(iq::iq2s_grid, [q, qh](int l) { return q[l] | ((qh >> (2 * l)) & 3) << 8; }),
                                              ld32(x + 34 + 4 * g)));
            m.sc[2 * g] = 2 * (x[74 + g] & 15) + 1;
            m.sc[2 * g + 1] = 2 * (x[74 + g] >> 4) + 1;
        }
        codes_C<16>(u, m);
        m.d = f16(x), m.dmin = 0.0f;
    }
};
// IQ3_XXS (98 bytes: fp16 d, qs[64] one iq3xxs_grid index (4 weights) per byte, then 8 aux words
// as IQ2_XXS's, one per 32 weights): 8 sub-blocks of 32 under 2 s + 1; FINAL 0.25.
struct GIQ3XXS {
    static constexpr int NSUB = 8;
    static constexpr bool MINS = false, UW = false, FMA = false;
    static constexpr float FINAL = 0.25f;
    static constexpr int WMAX = grid_wmax(iq::iq3xxs_grid);  // 62
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        for (int g = 0; g < 8; ++g) {
            const uint8_t *q = x + 2 + 8 * g;
            const uint32_t aux = ld32(x + 66 + 4 * g);
            _mm256_storeu_si256((__m256i *)(u + 32 * g),
                                signed_grid32(grid8x4(iq::iq3xxs_grid, [q](int k) { return q[k]; }), ksigns4(aux)));
            m.sc[g] = 2 * (int32_t)(aux >> 28) + 1;
        }
        codes_C<8>(u, m);
        m.d = f16(x), m.dmin = 0.0f;
    }
};
// IQ3_S (110 bytes: fp16 d, qs[64] the low 8 bits of a 9-bit iq3s_grid index (4 weights) per byte,
// qh[8] (bit k: index bit 8 of 4-group k of 32 weights g), signs[32] explicit, scales[4]: nibble
// g % 2 of byte g / 2): 8 sub-blocks of 32 under 2 s + 1; no constant after the last block.
struct GIQ3S {
    static constexpr int NSUB = 8;
    static constexpr bool MINS = false, UW = false, FMA = false;
    static constexpr int WMAX = grid_wmax(iq::iq3s_grid);  // 15
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        for (int g = 0; g < 8; ++g) {
            const uint8_t *q = x + 2 + 8 * g;
            const uint32_t qh = x[66 + g];
            _mm256_storeu_si256((__m256i *)(u + 32 * g),
                                signed_grid32(grid8x4(iq::iq3s_grid, [q, qh](int k) { return q[k] | ((qh >> k) & 1) << 8; }),
                                              ld32(x + 74 + 4 * g)));
            m.sc[g] = 2 * ((x[106 + g / 2] >> (4 * (g % 2))) & 15) + 1;
        }
        codes_C<8>(u, m);
        m.d = f16(x), m.dmin = 0.0f;
    }
};
// IQ1_S (50 bytes: fp16 d, qs[32] the low 8 bits of an 11-bit iq1s_grid index (8 weights, -1 / 0 /
// +1) per 8 weights, uint16 qh[8] per 32 weights: bits 3l .. 3l + 2 index bits 8..10 of 8-group l,
// bits 12..14 the scale s, bit 15 the delta's sign). The row kernels' X = 8 G + D (G = sum ls *
// grid . q, D = sum ls * dsign * sum q) and POST 0.125 (the delta's 1/8): here the code 8 grid +
// dsign (-9..9) under ls = 2 s + 1, 8 sub-blocks of 32.
struct GIQ1S {
    static constexpr int NSUB = 8;
    static constexpr bool MINS = false, UW = false, FMA = false;
    static constexpr float POST = 0.125f;
    static constexpr int WMAX = 9;  // 8 * 1 + 1
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        for (int g = 0; g < 8; ++g) {
            const uint8_t *q = x + 2 + 4 * g;
            const uint32_t qh = ld16(x + 34 + 2 * g);
            __m256i v = grid4x8(iq::iq1s_grid, [q, qh](int l) { return q[l] | ((qh >> (3 * l)) & 7) << 8; });
            v = _mm256_add_epi8(v, v), v = _mm256_add_epi8(v, v), v = _mm256_add_epi8(v, v);  // 8 grid: -8, 0, 8
            _mm256_storeu_si256((__m256i *)(u + 32 * g), _mm256_add_epi8(v, _mm256_set1_epi8(qh & 0x8000 ? -1 : 1)));
            m.sc[g] = 2 * (int32_t)((qh >> 12) & 7) + 1;
        }
        codes_C<8>(u, m);
        m.d = f16(x), m.dmin = 0.0f;
    }
};
// IQ1_M (56 bytes: qs[32] as IQ1_S's, qh[16]: nibble l % 2 of byte 2 g + l / 2 holds index bits 8..10
// of 8-group l of 32 weights g (bits 0..2) and its delta's sign (bit 3), scales as 4 uint16 words:
// 3-bit scales of 16 weights, sub-block 2 g + h at bits 6 (g % 2) + 3 h of word g / 2, and the fp16
// d in the words' top nibbles): X = 8 G + D as IQ1_S's, the code 8 grid + dsign (per 8 weights)
// under 2 s + 1, 16 sub-blocks of 16; POST 0.125.
struct GIQ1M {
    static constexpr int NSUB = 16;
    static constexpr bool MINS = false, UW = false, FMA = false;
    static constexpr float POST = 0.125f;
    static constexpr int WMAX = 9;
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        uint16_t w[4];
        std::memcpy(w, x + 48, 8);
        for (int g = 0; g < 8; ++g) {
            const uint8_t *q = x + 4 * g;
            const uint32_t nb = ld16(x + 32 + 2 * g);  // nibble l: 8-group l
            __m256i v = grid4x8(iq::iq1s_grid, [q, nb](int l) { return q[l] | ((nb >> (4 * l)) & 7) << 8; });
            v = _mm256_add_epi8(v, v), v = _mm256_add_epi8(v, v), v = _mm256_add_epi8(v, v);
            const auto ds = [nb](int l) { return (long long)((nb >> (4 * l + 3)) & 1 ? 0xffffffffffffffffULL : 0x0101010101010101ULL); };
            _mm256_storeu_si256((__m256i *)(u + 32 * g), _mm256_add_epi8(v, _mm256_setr_epi64x(ds(0), ds(1), ds(2), ds(3))));
            for (int h = 0; h < 2; ++h) m.sc[2 * g + h] = 2 * ((w[g / 2] >> (6 * (g % 2) + 3 * h)) & 7) + 1;
        }
        codes_C<16>(u, m);
        const uint16_t dh = (uint16_t)((w[0] >> 12) | ((w[1] >> 8) & 0x00f0) | ((w[2] >> 4) & 0x0f00) | (w[3] & 0xf000));
        m.d = _cvtsh_ss(dh), m.dmin = 0.0f;
    }
};
// TQ2_0 (66 bytes: qs[64], fp16 d): weight 128 h + 32 l + j is bits 2l + 1 : 2l of qs[32 h + j], the
// code c - 1 (-1..2; 3 never written by a quantizer, decoded as the row kernels do); one scale, 1.
struct GTQ2 {
    static constexpr int NSUB = 8;
    static constexpr bool MINS = false, UW = false, FMA = false;
    static constexpr int WMAX = 2;
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        const __m256i k03 = _mm256_set1_epi8(3), k01 = _mm256_set1_epi8(1);
        for (int h = 0; h < 2; ++h) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x + 32 * h));
            for (int l = 0; l < 4; ++l)
                _mm256_storeu_si256((__m256i *)(u + 128 * h + 32 * l),
                                    _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 2 * l), k03), k01));
        }
        for (int s = 0; s < 8; ++s) m.sc[s] = 1;
        codes_C<8>(u, m);
        m.d = f16(x + 64), m.dmin = 0.0f;
    }
};
// TQ1_0 (54 bytes: qs[48], qh[4], fp16 d; csrc/ref/ternary.cpp): trit k of byte b is floor(3 x / 256),
// x = (uint8)(b * 3^k), i.e. (x >= 86) + (x >= 171); qs[j < 32] trits 0..4 -> weights 32 k + j,
// qs[32 + j] -> 160 + 16 k + j, qh[j] trits 0..3 -> 240 + 4 k + j; the code trit - 1 (-1..1).
struct GTQ1 {
    static constexpr int NSUB = 8;
    static constexpr bool MINS = false, UW = false, FMA = false;
    static constexpr int WMAX = 1;
    // code = -1 - (x > 85) - (x > 170) as compares of x ^ 0x80 (signed) giving 0 / -1
    static LB_GK_INLINE __m256i code(__m256i xs) {
        const __m256i t1 = _mm256_cmpgt_epi8(xs, _mm256_set1_epi8((char)(85 ^ 0x80)));
        const __m256i t2 = _mm256_cmpgt_epi8(xs, _mm256_set1_epi8((char)(170 ^ 0x80)));
        return _mm256_sub_epi8(_mm256_set1_epi8(-1), _mm256_add_epi8(t1, t2));
    }
    static LB_GK_INLINE __m256i x3(__m256i v) { return _mm256_add_epi8(v, _mm256_add_epi8(v, v)); }
    static LB_GK_INLINE void decode(const uint8_t *x, uint8_t *u, RowSB &m) {
        const __m256i bias = _mm256_set1_epi8((char)0x80);
        // the bias survives the multiplications by 3^k: 128 * odd = 128 (mod 256)
        __m256i a = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)x), bias);
        __m256i b = _mm256_xor_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(x + 32))), bias);
        alignas(32) uint8_t tb[5][32];
        for (int k = 0; k < 5; ++k) {
            _mm256_storeu_si256((__m256i *)(u + 32 * k), code(a));
            _mm256_store_si256((__m256i *)tb[k], code(b));
            a = x3(a), b = x3(b);
        }
        for (int k = 0; k < 5; ++k) std::memcpy(u + 160 + 16 * k, tb[k], 16);
        for (int k = 0; k < 4; ++k)
            for (int j = 0; j < 4; ++j) {
                static constexpr uint8_t pow3[4] = {1, 3, 9, 27};
                const uint8_t v = (uint8_t)(x[48 + j] * pow3[k]);
                u[240 + 4 * k + j] = (uint8_t)(int8_t)((((unsigned)v * 3) >> 8) - 1);
            }
        for (int s = 0; s < 8; ++s) m.sc[s] = 1;
        codes_C<8>(u, m);
        m.d = f16(x + 52), m.dmin = 0.0f;
    }
};

// The float step of a format's row kernels: fma (the k-quants: GROUPS) unless D::FMA is false
// (IQ4_XS: the i-quants' multiply, then add).
template <class D, class = void>
struct FmaStep : std::true_type {};
template <class D>
struct FmaStep<D, std::void_t<decltype(D::FMA)>> : std::integral_constant<bool, D::FMA> {};
// POST and FINAL (csrc/x86/iquants.inl's kPost, kFinal; 1 where a decoder names none): the float
// factor on (float)I before its multiply by d * d_a (IQ1_*: 0.125), and the one on the accumulated
// float after the last super-block (IQ2_*: 0.125, IQ3_XXS: 0.25), applied as the row kernels do.
template <class D, class = void>
struct PostK { static constexpr float value = 1.0f; };
template <class D>
struct PostK<D, std::void_t<decltype(D::POST)>> { static constexpr float value = D::POST; };
template <class D, class = void>
struct FinalK { static constexpr float value = 1.0f; };
template <class D>
struct FinalK<D, std::void_t<decltype(D::FINAL)>> { static constexpr float value = D::FINAL; };
// The pairs of activation sums a format's mins take (ActSBT): 8 of 16-sums where D::BS16, else 4.
template <class D, class = void>
struct BsPairs : std::integral_constant<int, 4> {};
template <class D>
struct BsPairs<D, std::void_t<decltype(D::BS16)>> : std::integral_constant<int, D::BS16 ? 8 : 4> {};
template <class D>
using ActOf = ActSBT<BsPairs<D>::value>;

// ---- the float steps, shared by every microkernel here -----------------------------------------
// One (row, lane vector, super-block) after its integer sums I (and M, the MINS formats'): I less
// the activations' +128 (C; not D::UW), then (header)
//   acc = fma(d * d_a, I, acc)   (the i-quants, FMA = false: acc + (d * d_a) * (POST * I))
//   acc = fnmadd(dmin * d_a, M, acc)   (MINS)
// on the accumulators o (L1); da: the lane vector's d_a
template <class D>
LB_GK_INLINE void float_step(VI I, VI M, const RowSB &m, const float *da_p, float *o) {
    if constexpr (!D::UW) I = vsub(I, vset1(m.C));
    const VF da = fld(da_p);
    VF acc;
    if constexpr (FmaStep<D>::value) acc = ffma(fmul(da, fset1(m.d)), fcvt(I), fldu(o));
    else {
        VF xf = fcvt(I);
        if constexpr (PostK<D>::value != 1.0f) xf = fmul(fset1(PostK<D>::value), xf);
        acc = fadd(fldu(o), fmul(fmul(da, fset1(m.d)), xf));
    }
    if constexpr (D::MINS) acc = ffnma(fmul(da, fset1(m.dmin)), fcvt(M), acc);
    else (void)M;
    fst(o, acc);
}
// out = FINAL * acc, once after the last super-block (the row kernels' kFinal), for R rows x V
// lane vectors of res (the microkernels' layout)
template <class D>
LB_GK_INLINE void final_step(int R, int V, float *res) {
    if constexpr (FinalK<D>::value != 1.0f) {
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r)
            #pragma GCC unroll 16
            for (int v = 0; v < V; ++v) {
                float *o = res + (size_t)(r * MAXV + v) * LANES;
                fst(o, fmul(fset1(FinalK<D>::value), fldu(o)));
            }
    } else {
        (void)R, (void)V, (void)res;
    }
}

// ---- the microkernel --------------------------------------------------------------------------
// R rows (row r's codes at u0 + r * nb * 256, its metadata at m0 + r * nb) x V lane vectors of
// the activation panel (vector v's at act0 + v * nb) -> res[(r * MAXV + v) * 16 + lane] (float).
// (Bases and strides, not arrays of pointers: those would be built on the stack, I7.)
template <class D, int R, int V>
__attribute__((noinline)) void mk_gemm(const uint8_t *u0, const RowSB *m0, const ActOf<D> *act0, int64_t nb, float *res,
                                       VI *il1) {
    const size_t us = (size_t)nb * QK, ms = (size_t)nb;
#define u(r) (u0 + (size_t)(r) * us)
#define m(r) (m0 + (size_t)(r) * ms)
#define act(v) (act0 + (size_t)(v) * ms)
    static_assert(D::UW ? 2 * D::WMAX * 128 <= 32767 : D::WMAX <= W_MAX,
                  "this level's vdot is not exact for the format's codes");
    static_assert(FmaStep<D>::value ? PostK<D>::value == 1.0f && FinalK<D>::value == 1.0f : !D::MINS,
                  "POST / FINAL belong to the i-quants' float step (FMA = false, no mins)");
    constexpr int DW = 64 / D::NSUB;  // dwords per sub-block
    // The float accumulators live in res (L1), loaded and stored once per super-block and
    // (row, lane vector): the registers go to the integer sums (no spills under GCC or clang, I7).
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
        #pragma GCC unroll 16
        for (int v = 0; v < V; ++v) fst(res + (size_t)(r * MAXV + v) * LANES, fzero());
    // avx2's passes of 2 vectors (MAXR_KQ's header): the super-block sums I in L1 too, il1[r * V +
    // v] (the caller's buffer of MAXR_KQ x MAXV vectors: on the stack they would be what the I7
    // check counts), each sub-block's int32 dots added there, re-read for the float steps
    constexpr bool kIL1 = kq_il1(R, V);
    const auto isum = [&](VI (&I)[R][V], int r, int v, VI x) {  // I[r][v] += x, where I lives
        if constexpr (kIL1) {
            VI *q = il1 + r * V + v;
            vst(q, vadd(vld(q), x));
        } else {
            I[r][v] = vadd(I[r][v], x);
        }
    };
    for (int64_t b = 0; b < nb; ++b) {
        VI I[R][V], dt[R][V];
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r)
            #pragma GCC unroll 16
            for (int v = 0; v < V; ++v) {
                if constexpr (kIL1) {
                    vst(il1 + r * V + v, vset1(0));
                } else {
                    I[r][v] = vset1(0);
                }
            }
        for (int s = 0; s < D::NSUB; ++s) {
#if defined(LB_GK_PRESUM16)
            // avx2, the narrow codes: the int16 sums of K dwords straight into I by one vpmaddwd
            // with the sub-block's scale in both words of every dword (sc * p_lo + sc * p_hi = sc *
            // (p_lo + p_hi): the same exact integer as madd with ones then vpmulld by sc, |sc * p| <=
            // 128 * 32767 per word; no dt register, no vpmulld). Zen 3, builds alternated under load
            // (bench kernels --n 4096 --mb 16 --cpu 1 --clock cpu --stat min, gemm before / after at
            // 64 and 256 tokens): Q4_K, Q5_K, Q3_K even within the noise, TQ2_0 1.11-1.13 at 64.
            constexpr int K = presum_k<D>();
            if constexpr (K >= 4) {  // Q4_K, Q5_K, Q2_K, Q3_K (Q6_K: 2, vdot)
                #pragma GCC unroll 16
                for (int g0 = 0; g0 < DW; g0 += K) {
                    vdots16f<R, V, D::UW>(g0, std::min(g0 + K, DW),
                                  [&](int v, int g) { return vld((const void *)act(v)[b].q[s * DW + g]); },
                                  [&](int r, int g) {
                                      int32_t wv;
                                      std::memcpy(&wv, u(r) + (size_t)b * QK + 4 * (s * DW + g), 4);
                                      return wv;
                                  },
                                  [&](int r) {  // sc in both words (|sc| < 2^15: its low half, vpbroadcastw)
                                      int16_t c;
                                      std::memcpy(&c, &m(r)[b].sc[s], 2);
                                      return _mm256_set1_epi16(c);
                                  },
                                  [&](int r, int v, VI x) { isum(I, r, v, x); });
                    if constexpr (kIL1) __asm__ volatile("" : : "r"(il1) : "memory");  // I stays in L1
                }
                continue;
            }
#endif
            #pragma GCC unroll 16
            for (int r = 0; r < R; ++r)
                #pragma GCC unroll 16
                for (int v = 0; v < V; ++v) dt[r][v] = vset1(0);
            #pragma GCC unroll 16
            for (int g = 0; g < DW; ++g) {
                const int dw = s * DW + g;
                VI a[V];
                #pragma GCC unroll 16
                for (int v = 0; v < V; ++v) a[v] = vld((const void *)act(v)[b].q[dw]);
                #pragma GCC unroll 16
                for (int r = 0; r < R; ++r) {
                    int32_t wv;
                    std::memcpy(&wv, u(r) + (size_t)b * QK + 4 * dw, 4);
                    const VI w = vset1(wv);
                    #pragma GCC unroll 16
                    for (int v = 0; v < V; ++v) dt[r][v] = D::UW ? vdot(dt[r][v], w, a[v]) : vdot(dt[r][v], a[v], w);
                }
#if defined(__clang__)
                // the next dword's loads wait for this one's dots: clang otherwise loaded 4 dwords'
                // activations ahead and spilled 3 sums at V = 3 (I7; GCC does not, and spilled with it)
                __asm__ volatile("" : : "v"(dt[R - 1][V - 1]) : "memory");
#endif
            }
            #pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                const VI sc = vset1(m(r)[b].sc[s]);
                #pragma GCC unroll 16
                for (int v = 0; v < V; ++v) isum(I, r, v, vmullo(dt[r][v], sc));
            }
            if constexpr (kIL1) __asm__ volatile("" : : "r"(il1) : "memory");
        }
        // Row by row (so that only V vectors of M are live besides I and acc): M (the mins
        // term), the activations' +128 out of I, then the float steps (header):
        //   acc = fma(d * d_a, I, acc);   acc = fnmadd(dmin * d_a, M, acc)
        __asm__ volatile("" ::: "memory");  // acc from res, not from registers (header)
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            VI M[V];
            #pragma GCC unroll 16
            for (int v = 0; v < V; ++v) M[v] = vset1(0);  // (unread without MINS)
            if constexpr (D::MINS) {
                #pragma GCC unroll 8
                for (int p = 0; p < BsPairs<D>::value; ++p) {
                    const VI c = vset1(m(r)[b].mn[p]);
                    #pragma GCC unroll 16
                    for (int v = 0; v < V; ++v) {
                        VI x = vdot16(M[v], vld((const void *)act(v)[b].bs[p]), c);
#if defined(LB_GK_KQ_V2)
                        __asm__("" : "+v"(x));  // in order (as vdot's fence: Q2_K's 8 pairs x 2 spilled as a tree)
#endif
                        M[v] = x;
                    }
                }
            }
            #pragma GCC unroll 16
            for (int v = 0; v < V; ++v) {
                if constexpr (kIL1) I[r][v] = vld(il1 + r * V + v);
                float_step<D>(I[r][v], M[v], m(r)[b], act(v)[b].d, res + (size_t)(r * MAXV + v) * LANES);
            }
        }
    }
    final_step<D>(R, V, res);
#undef u
#undef m
#undef act
}

template <class D>
using MkFn = void (*)(const uint8_t *, const RowSB *, const ActOf<D> *, int64_t, float *, VI *);
#if defined(LB_GK_KQ_V2)
// avx2: the passes of 2 vectors are the presum16 formats' (Q4_K, Q5_K, Q2_K, Q3_K and the R8
// layouts); the others (vdot, or their grids' lookups) spill at 4 x 2 and keep passes of 1 (kq_pv)
template <class D, int R, int V>
constexpr MkFn<D> kq_entry() {
    if constexpr (V <= kq_pv<D>() && (V > 1 || R <= MAXR1)) return &mk_gemm<D, R, V>;
    else return nullptr;
}
template <class D>
constexpr MkFn<D> kMk[MAXR_KQ + 1][MAXV + 1] = {
    {nullptr, nullptr, nullptr}, {nullptr, kq_entry<D, 1, 1>(), kq_entry<D, 1, 2>()},
    {nullptr, kq_entry<D, 2, 1>(), kq_entry<D, 2, 2>()}, {nullptr, kq_entry<D, 3, 1>(), kq_entry<D, 3, 2>()},
    {nullptr, kq_entry<D, 4, 1>(), kq_entry<D, 4, 2>()}};
#else
template <class D>
constexpr MkFn<D> kMk[MAXR_KQ + 1][MAXV + 1] = LB_GK_TABLE(mk_gemm<D,);
#endif
template <class D>
constexpr MkFn<D> kMk1[MAXR1 + 1] = LB_GK_TABLE1(mk_gemm<D,);  // one-vector passes

// ---- the activation panel: nt tokens of Q8_K rows -> ceil(nt / 16) groups of nb ActSB -----
// (X128: each byte + 128, for the formats whose codes are vpdpbusd's signed operand; !D::UW)
template <bool X128, int NP>
__attribute__((noinline)) void build_act_panel(const uint8_t *act, size_t act_stride, int nt, int64_t nb,
                                               ActSBT<NP> *panel) {
    const int ng = (nt + LANES - 1) / LANES;
    for (int g = 0; g < ng; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            ActSBT<NP> &P = panel[(size_t)g * (size_t)nb + (size_t)b];
            for (int l = 0; l < LANES; ++l) {
                const int t = g * LANES + l;
                if (t >= nt) {  // absent tokens: activations 0 (bytes 128 or 0), bsums 0, d 0
                    for (int dw = 0; dw < 64; ++dw) std::memset(P.q[dw] + 4 * l, X128 ? 0x80 : 0, 4);
                    for (int p = 0; p < NP; ++p) P.bs[p][l] = 0;
                    P.d[l] = 0.0f;
                    continue;
                }
                const uint8_t *y = act + (size_t)t * act_stride + (size_t)b * sizeof(block_q8_K);
                for (int dw = 0; dw < 64; ++dw) {
                    uint32_t v;
                    std::memcpy(&v, y + Q8K_QS + 4 * dw, 4);
                    if (X128) v ^= 0x80808080u;  // q + 128 per byte
                    std::memcpy(P.q[dw] + 4 * l, &v, 4);
                }
                int16_t bsum[16];  // of 16 q each
                std::memcpy(bsum, y + Q8K_BS, sizeof bsum);
                for (int p = 0; p < NP; ++p)
                    P.bs[p][l] = NP == 8 ? pair16(bsum[2 * p], bsum[2 * p + 1])
                                         : pair16(bsum[4 * p] + bsum[4 * p + 1], bsum[4 * p + 2] + bsum[4 * p + 3]);
                std::memcpy(&P.d[l], y + Q8K_D, 4);
            }
        }
}

// Per-thread scratch, 64-byte aligned, grown on demand (never shrunk).
struct Scratch {
    void *p = nullptr;
    size_t cap = 0;
    void *get(size_t bytes) {
        if (bytes > cap) {
            std::free(p);
            cap = (bytes + 4095) & ~(size_t)4095;
            p = std::aligned_alloc(64, cap);
        }
        return p;
    }
    ~Scratch() { std::free(p); }
};

// The next row tile's raw bytes pulled towards L2 while the current tile computes, in equal
// slices before each microkernel call of the tile's LAST pass over the chunk's tokens. For a
// matrix streamed from DRAM the tile's decode would otherwise wait on memory, and the compute
// phases would leave the bus idle (Zen 5, Q8_0 rows of n = 512 from DRAM: the GEMM at 16 tokens
// ran 2x slower than the windows without it). Only the last pass: a long chunk's earlier passes
// stream its activation panel (2.3 MB per tile at 512 tokens x n = 4096) through L2, which could
// evict lines pulled then. (Measured on Zen 5, 512-token prefill of an 8B-shaped slice: the last
// pass, the last ~512 KB of panel traffic, or every pass were within noise of each other; the
// tile decode's loads took 2-12% of the samples from run to run with any of them.)
struct NextTile {
    const char *p = nullptr;
    size_t left = 0, slice = 0;
    LB_GK_INLINE void start(const RowArgs &a, int64_t re, int64_t r1, int64_t rt, int64_t calls) {
        const int64_t ne = std::min(re + rt, r1);
        p = (const char *)(a.w + (size_t)re * a.w_stride);
        left = ne > re ? (size_t)(ne - re) * a.w_stride : 0;
        slice = ((left + (size_t)calls - 1) / (size_t)calls + 63) & ~(size_t)63;
    }
    LB_GK_INLINE void step() {
        const size_t n = std::min(slice, left);
        for (size_t l = 0; l < n; l += 64) _mm_prefetch(p + l, _MM_HINT_T1);
        p += n, left -= n;
    }
};

// Floats of a tile's result buffer (tile_loop): RT rows x MAXV lane vectors.
constexpr size_t tile_res_floats(int64_t rt) { return (size_t)rt * MAXV * LANES; }
// Rows per tile for rows of per_row bytes of codes and metadata: about 256 KB (L2), a multiple of
// 4 in 4..64; at the amx level of 16 in 16..64 (its microkernels' A tiles read 16 rows of codes,
// so a tile's last group stays within the buffer)
#if defined(LOWBIT_AMX)
constexpr int64_t kTileRowStep = 16;
constexpr int kGemmRows = 16;  // (KernelEntry::gemm_rows: the tiles' 16-row groups)
#else
constexpr int64_t kTileRowStep = 4;
constexpr int kGemmRows = 1;
#endif
constexpr int64_t tile_rows(size_t per_row) {
    return std::clamp<int64_t>((int64_t)(262144 / per_row) & ~(kTileRowStep - 1), kTileRowStep, 64);
}

#if defined(__AVX512F__)
// A 16 x 16 block transposed: row i's 16 floats at src + i * rs -> column j's 16 floats (row 0
// first) at dst + j * ds, for the columns j < ncol (the lanes of tokens in the chunk). Exact
// copies (unpacks and 128-bit lane shuffles), so the results' bits are unchanged.
LB_GK_INLINE void transpose16(const float *src, size_t rs, float *dst, size_t ds, int ncol) {
    __m512 r[16], t[16];
    #pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + (size_t)i * rs);
    #pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {  // 128-bit lane k of t[i]: rows i, i + 1 of columns 4k, 4k + 1
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);  // ... of columns 4k + 2, 4k + 3
    }
    #pragma GCC unroll 4
    for (int g = 0; g < 16; g += 4) {  // lane k of r[g + c]: rows g .. g + 3 of column 4k + c
        const __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]);
        const __m512d c = _mm512_castps_pd(t[g + 2]), d = _mm512_castps_pd(t[g + 3]);
        r[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    #pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {  // column 4k + c: lane k of r[c], r[4 + c], r[8 + c], r[12 + c]
        const __m512 va = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), vb = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        const __m512 wa = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88), wb = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        t[c] = _mm512_shuffle_f32x4(va, wa, 0x88);       // k = 0
        t[4 + c] = _mm512_shuffle_f32x4(vb, wb, 0x88);   // k = 1
        t[8 + c] = _mm512_shuffle_f32x4(va, wa, 0xDD);   // k = 2
        t[12 + c] = _mm512_shuffle_f32x4(vb, wb, 0xDD);  // k = 3
    }
    #pragma GCC unroll 16
    for (int j = 0; j < 16; ++j)  // (a constant j: t stays in registers under clang too)
        if (j < ncol) _mm512_storeu_ps(dst + (size_t)j * ds, t[j]);
}
#else
// An 8 x 8 block transposed (avx2 and avx2vnni: 8 lanes): row i's 8 floats at src + i * rs ->
// column j's 8 floats (row 0 first) at dst + j * ds, for the columns j < ncol. Exact copies
// (unpacks, shuffles and 128-bit lane moves), so the results' bits are unchanged.
LB_GK_INLINE void transpose8(const float *src, size_t rs, float *dst, size_t ds, int ncol) {
    const auto ld = [&](int i) { return _mm256_loadu_ps(src + (size_t)i * rs); };
    // rows (0, 1), (2, 3), ...: [r0[0] r1[0] r0[1] r1[1] | r0[4] ..], the high halves likewise
    const __m256 t0 = _mm256_unpacklo_ps(ld(0), ld(1)), t1 = _mm256_unpackhi_ps(ld(0), ld(1));
    const __m256 t2 = _mm256_unpacklo_ps(ld(2), ld(3)), t3 = _mm256_unpackhi_ps(ld(2), ld(3));
    const __m256 t4 = _mm256_unpacklo_ps(ld(4), ld(5)), t5 = _mm256_unpackhi_ps(ld(4), ld(5));
    const __m256 t6 = _mm256_unpacklo_ps(ld(6), ld(7)), t7 = _mm256_unpackhi_ps(ld(6), ld(7));
    // columns j and j + 4 of rows 0..3 (u0 .. u3) and of rows 4..7 (u4 .. u7)
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    // each column stored as it is formed (all 8 formed first, one was spilled: I7)
    const auto st = [&](int j, __m256 c) {
        if (j < ncol) _mm256_storeu_ps(dst + (size_t)j * ds, c);
    };
    st(0, _mm256_permute2f128_ps(u0, u4, 0x20)), st(4, _mm256_permute2f128_ps(u0, u4, 0x31));
    st(1, _mm256_permute2f128_ps(u1, u5, 0x20)), st(5, _mm256_permute2f128_ps(u1, u5, 0x31));
    st(2, _mm256_permute2f128_ps(u2, u6, 0x20)), st(6, _mm256_permute2f128_ps(u2, u6, 0x31));
    st(3, _mm256_permute2f128_ps(u3, u7, 0x20)), st(7, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#endif

// A pass's results (tres, tile_loop's layout) to out[t][rb .. rb + rows) for its tokens t < nt:
// per lane vector, blocks of 16 rows x 16 tokens transposed in registers at avx512 (the scalar
// copy was 2.3% of an 8B-shaped prefill's samples, 4.4% of a 30B-A3B-shaped one's), of 8 x 8
// below (it was 6% of the default model's prefill at avx2, Zen 3), the rest (rows past a
// multiple of the block) copied one float at a time.
// Not inlined: clang vectorises the strided copy with gathers whose index vectors, hoisted into
// the caller, would be saved around every microkernel call (I7's check_spills).
__attribute__((noinline)) inline void store_pass(const RowArgs &a, const float *tres, int64_t rb, int rows, int g0,
                                                 int V, int nt) {
    for (int v = 0; v < V; ++v) {
        const int t0 = (g0 + v) * LANES, nl = std::min(LANES, nt - t0);
        if (nl <= 0) return;
        int i0 = 0;
#if defined(__AVX512F__)
        for (; i0 + 16 <= rows; i0 += 16)
            transpose16(tres + ((size_t)i0 * MAXV + (size_t)v) * LANES, (size_t)MAXV * LANES,
                        a.out + (size_t)t0 * a.out_stride + (size_t)(rb + i0), a.out_stride, nl);
#else
        for (; i0 + 8 <= rows; i0 += 8)
            transpose8(tres + ((size_t)i0 * MAXV + (size_t)v) * LANES, (size_t)MAXV * LANES,
                       a.out + (size_t)t0 * a.out_stride + (size_t)(rb + i0), a.out_stride, nl);
#endif
        for (int l = 0; l < nl; ++l) {
            float *o = a.out + (size_t)(t0 + l) * a.out_stride + (size_t)rb;
            const float *src = tres + (size_t)v * LANES + l;
            for (int i = i0; i < rows; ++i) o[i] = src[(size_t)i * MAXV * LANES];
        }
    }
}

// The lines of out[t0 .. t1)[rb .. re) for writing, ahead of the pass whose store_pass writes
// them: a prompt chunk's outputs (512 tokens x 14336 rows: 29 MB) are out of the caches, and each
// store reads its line for ownership first. (The amx level's Q4_K GEMM, n = 4096, 512 tokens:
// its per-token work outside the microkernel, store_pass's, ~9% of the time; with this 2-3% less
// in all: BENCHMARKS.md round 23)
LB_GK_INLINE void prefetch_out(const RowArgs &a, int64_t rb, int64_t re, int t0, int t1) {
    for (int t = t0; t < t1; ++t) {
        const uintptr_t b = (uintptr_t)(a.out + (size_t)t * a.out_stride + (size_t)rb) & ~(uintptr_t)63;
        const uintptr_t e = (uintptr_t)(a.out + (size_t)t * a.out_stride + (size_t)re);
        for (uintptr_t l = b; l < e; l += 64) __builtin_prefetch((const void *)l, 1, 3);
    }
}
// The tile loop every GEMM here shares. Rows [r0, r1) go in tiles of RT (decode(rb, re) lays a
// tile's codes out once per call); each tile takes passes of PV <= MAXV lane vectors (PV * LANES
// tokens), each pass every group of MR rows (MR1 in a pass of one vector): mk(i0, R, g0, V, res)
// for the tile's rows i0 .. i0 + R - 1 and lane vectors g0 .. g0 + V - 1, res the group's slice of
// the tile's result buffer tres (tile row i, vector v, lane l at (i * MAXV + v) * LANES + l: the
// layout a microkernel writes). After a pass, store_pass sends each of its tokens' results for the
// tile's rows to out as one contiguous run (out[t][rb .. re)); per microkernel call they would be
// R floats in each of 32 lines, a line written by several calls (5% of an 8B-shaped prefill's
// samples).
template <class Decode, class Mk>
LB_GK_INLINE void tile_loop(const RowArgs &a, int64_t r0, int64_t r1, int64_t RT, int MR, int MR1, int PV, int nt,
                            float *tres, const Decode &decode, const Mk &mk) {
    const int ng = (nt + LANES - 1) / LANES;
    const int mr_last = ng - (ng - 1) / PV * PV == 1 ? MR1 : MR;  // the last pass's rows per call
    NextTile next;
    for (int64_t rb = r0; rb < r1; rb += RT) {
        const int64_t re = std::min(rb + RT, r1);
        decode(rb, re);
        next.start(a, re, r1, RT, (re - rb + mr_last - 1) / mr_last);
        for (int g0 = 0; g0 < ng; g0 += PV) {
            const int V = std::min(PV, ng - g0);
            const bool last = g0 + PV >= ng;
            const int mr = V == 1 ? MR1 : MR;
            prefetch_out(a, rb, re, g0 * LANES, std::min(nt, (g0 + V) * LANES));
            for (int64_t rq = rb; rq < re; rq += mr) {
                const int R = (int)std::min<int64_t>(mr, re - rq);
                if (last) next.step();
                mk(rq - rb, R, g0, V, tres + (size_t)(rq - rb) * MAXV * LANES);
            }
            store_pass(a, tres, rb, (int)(re - rb), g0, V, nt);
        }
    }
}

// An 8 x 8 dword transpose: v(k) gives vector k (dword j of it: row j's dword k), st(j, x) takes
// row j's 8 dwords in order (the R8 layouts' code dwords back into rows).
template <class Ld, class St>
LB_GK_INLINE void transpose8x8_dwords(const Ld &v, const St &st) {
    const __m256i t0 = _mm256_unpacklo_epi32(v(0), v(1)), t1 = _mm256_unpackhi_epi32(v(0), v(1));
    const __m256i t2 = _mm256_unpacklo_epi32(v(2), v(3)), t3 = _mm256_unpackhi_epi32(v(2), v(3));
    const __m256i t4 = _mm256_unpacklo_epi32(v(4), v(5)), t5 = _mm256_unpackhi_epi32(v(4), v(5));
    const __m256i t6 = _mm256_unpacklo_epi32(v(6), v(7)), t7 = _mm256_unpackhi_epi32(v(6), v(7));
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    st(0, _mm256_permute2x128_si256(u0, u4, 0x20));
    st(1, _mm256_permute2x128_si256(u1, u5, 0x20));
    st(2, _mm256_permute2x128_si256(u2, u6, 0x20));
    st(3, _mm256_permute2x128_si256(u3, u7, 0x20));
    st(4, _mm256_permute2x128_si256(u0, u4, 0x31));
    st(5, _mm256_permute2x128_si256(u1, u5, 0x31));
    st(6, _mm256_permute2x128_si256(u2, u6, 0x31));
    st(7, _mm256_permute2x128_si256(u3, u7, 0x31));
}

// Q4_K's R8 layout (csrc/repack.h; its windows: csrc/x86/{avx2,avx512}/kq_r8.cpp): the same codes and
// metadata as GQ4K's, so the same microkernels and the same results (I8). A tile's whole groups
// of 8 rows take each chunk's 8 code dwords of the 8 rows as an 8 x 8 dword transpose; rows of a
// group the tile cuts, one row at a time (a gather per chunk).
struct GQ4K_R8 : GQ4K {
    static constexpr bool R8 = true;
};
// Row j's scales, mins, d and dmin from an R8 group's super-block o
LB_GK_INLINE void r8_meta(const uint8_t *o, int j, RowSB &m) {
    uint8_t q[12];
    std::memcpy(q, o + 32 + 4 * j, 4);
    std::memcpy(q + 4, o + 64 + 4 * j, 4);
    std::memcpy(q + 8, o + 96 + 4 * j, 4);
    scales_mins_k4(q, m);
    m.C = 0;
    m.d = f16(o + 2 * j), m.dmin = f16(o + 16 + 2 * j);
}
LB_GK_INLINE void r8_codes(__m256i q, uint8_t *u) {
    const __m256i k0F = _mm256_set1_epi8(0x0F);
    _mm256_storeu_si256((__m256i *)u, _mm256_and_si256(q, k0F));
    _mm256_storeu_si256((__m256i *)(u + 32), _mm256_and_si256(_mm256_srli_epi16(q, 4), k0F));
}
__attribute__((noinline)) void decode_tile_r8(const RowArgs &a, int64_t rb, int64_t re, int64_t nb, uint8_t *codes,
                                              RowSB *meta) {
    const size_t ucodes = (size_t)nb * QK;  // codes per row in the tile
    for (int64_t r = rb; r < re;) {
        const int j0 = (int)(r % 8);
        const uint8_t *base = a.w + (size_t)(r - j0) * a.w_stride;
        if (j0 == 0 && r + 8 <= re) {  // rows r .. r + 7: one whole group
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t *o = base + (size_t)b * 1152;
                prefetch_tile_ahead(o, 1152);
                for (int j = 0; j < 8; ++j) r8_meta(o, j, meta[(size_t)(r - rb + j) * (size_t)nb + (size_t)b]);
                for (int c = 0; c < 4; ++c) {
                    const uint8_t *q = o + 128 + 256 * c;
                    uint8_t *u = codes + (size_t)(r - rb) * ucodes + (size_t)b * QK + 64 * (size_t)c;
                    transpose8x8_dwords([&](int k) { return _mm256_loadu_si256((const __m256i *)(q + 32 * k)); },
                                        [&](int j, __m256i x) { r8_codes(x, u + (size_t)j * ucodes); });
                }
            }
            r += 8;
        } else {  // row r alone: dword k of chunk c at 128 + 256 c + 32 k + 4 j0
            const __m256i idx = _mm256_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224);
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t *o = base + (size_t)b * 1152;
                r8_meta(o, j0, meta[(size_t)(r - rb) * (size_t)nb + (size_t)b]);
                for (int c = 0; c < 4; ++c)
                    r8_codes(_mm256_i32gather_epi32((const int *)(o + 128 + 256 * c + 4 * j0), idx, 1),
                             codes + (size_t)(r - rb) * ucodes + (size_t)b * QK + 64 * (size_t)c);
            }
            r += 1;
        }
    }
}
template <class D, class = void>
struct IsR8 : std::false_type {};
template <class D>
struct IsR8<D, std::void_t<decltype(D::R8)>> : std::true_type {};
#if defined(__AVX512F__)
// Q5_K's R8 layout (repack.h; its windows: csrc/x86/avx512/kq_r8.cpp): each row of the tile is
// moved back into its own super-blocks (unpack_r8_row: 4-byte copies, once per row and call),
// then decoded as Q5_K's, so the same codes, metadata and results (I8).
struct GQ5K_R8 : GQ5K {
    static constexpr bool R8_ROWS = true;
    static constexpr int R8_FORMAT = T_Q5_K;  // the format unpack_r8_row puts the rows back into
};
// IQ4_XS's R8 layout (repack.h; its windows: csrc/x86/avx512/kq_r8.cpp): the same, decoded as
// IQ4_XS's (GIQ4XS); a tile's whole groups of 8 rows put back together by dword transposes
// (decode_tile), not row by row.
struct GIQ4XS_R8 : GIQ4XS {
    static constexpr bool R8_ROWS = true;
    static constexpr int R8_FORMAT = T_IQ4_XS;
};
#endif
// The layouts whose tiles are put back together row by row (R8_ROWS): Q5_K's and IQ4_XS's (avx512)
// and the legacy formats' (GR8Rows, every level)
template <class D, class = void>
struct IsR8Rows : std::false_type {};
template <class D>
struct IsR8Rows<D, std::void_t<decltype(D::R8_ROWS)>> : std::true_type {};

// Row r of an R8 layout (R8_ROWS) unpacked into row (nb blocks) and decoded as the format's into
// the codes and metadata of tile row r - rb
template <class D, size_t BYTES>
inline void decode_row_r8(const RowArgs &a, int64_t r, int64_t rb, int64_t nb, uint8_t *row, uint8_t *codes,
                          RowSB *meta) {
    unpack_r8_row(D::R8_FORMAT, a.w, a.w_stride, r, a.n, row);
    for (int64_t b = 0; b < nb; ++b)
        D::decode(row + (size_t)b * BYTES, codes + (size_t)(r - rb) * (size_t)nb * QK + (size_t)b * QK,
                  meta[(size_t)(r - rb) * (size_t)nb + (size_t)b]);
}

// Rows [rb, re) decoded into the tile's codes and metadata (not inlined: the decoders' small
// scale arrays live on the stack, and this is once per row and call, not per token).
template <class D, size_t BYTES>
__attribute__((noinline)) void decode_tile(const RowArgs &a, int64_t rb, int64_t re, int64_t nb, uint8_t *codes,
                                           RowSB *meta) {
    if constexpr (IsR8<D>::value) return decode_tile_r8(a, rb, re, nb, codes, meta);
    if constexpr (IsR8Rows<D>::value) {
        static thread_local std::vector<uint8_t> row;
        row.resize((size_t)nb * BYTES);
        if constexpr (D::R8_FORMAT == T_IQ4_XS) {
            // whole groups of 8 rows in the tile: each super-block's 8 blocks put back together at
            // once (the header's pieces by copies; the codes, dwords 8m .. 8m + 7 of the 8 rows, by
            // an 8 x 8 dword transpose), then decoded as IQ4_XS's; rows of a group the tile cuts
            // one by one
            for (int64_t r = rb; r < re;) {
                if (r % kR8Rows || r + kR8Rows > re) {
                    decode_row_r8<D, BYTES>(a, r, rb, nb, row.data(), codes, meta);
                    ++r;
                    continue;
                }
                const uint8_t *base = a.w + (size_t)r * a.w_stride;
                for (int64_t b = 0; b < nb; ++b) {
                    const uint8_t *o = base + (size_t)b * kR8GroupIq4xs;
                    prefetch_tile_ahead(o, kR8GroupIq4xs);
                    alignas(32) uint8_t blk[kR8Rows][BYTES + 8];
                    for (int j = 0; j < kR8Rows; ++j) {
                        std::memcpy(blk[j], o + 2 * j, 2);
                        std::memcpy(blk[j] + 2, o + 16 + 2 * j, 2);
                        std::memcpy(blk[j] + 4, o + 32 + 4 * j, 4);
                    }
                    for (int m = 0; m < 4; ++m) {
                        const uint8_t *q = o + kR8QsIq4xs + 256 * m;
                        transpose8x8_dwords([&](int k) { return _mm256_loadu_si256((const __m256i *)(q + 32 * k)); },
                                            [&](int j, __m256i x) { _mm256_storeu_si256((__m256i *)(blk[j] + 8 + 32 * m), x); });
                    }
                    for (int j = 0; j < kR8Rows; ++j)
                        D::decode(blk[j], codes + (size_t)(r + j - rb) * (size_t)nb * QK + (size_t)b * QK,
                                  meta[(size_t)(r + j - rb) * (size_t)nb + (size_t)b]);
                }
                r += kR8Rows;
            }
            return;
        }
        for (int64_t r = rb; r < re; ++r) decode_row_r8<D, BYTES>(a, r, rb, nb, row.data(), codes, meta);
        return;
    }
    for (int64_t r = rb; r < re; ++r) {
        const uint8_t *w = a.w + (size_t)r * a.w_stride;
        uint8_t *u = codes + (size_t)(r - rb) * (size_t)nb * QK;
        RowSB *m = meta + (size_t)(r - rb) * (size_t)nb;
        for (int64_t b = 0; b < nb; ++b) {
            prefetch_tile_ahead(w + (size_t)b * BYTES, BYTES);  // (the first tile of a call: not pulled by NextTile)
            D::decode(w + (size_t)b * BYTES, u + (size_t)b * QK, m[b]);
        }
    }
}


#if defined(LOWBIT_AMX)
// ---- the amx level's microkernels (csrc/x86/amx_tiles.h) ---------------------------------------
// Two ways, both with mk_gemm's decode (codes, RowSB), panels and float steps, so the same integers
// and the same bits (I8): Q2_K, Q4_K, Q5_K (and their R8 layouts) fold their scales into the codes
// at the tile's decode and take whole super-blocks per tile product (mk_amx_scaled, below); the
// signed-code formats (Q3_K, Q6_K, IQ4_XS, the grid i-quants, IQ1_*, TQ*) take mk_amx, where
// only each sub-block's dots come from tiles. Per lane vector v of tokens,
// super-block b and sub-block s, for a group of 16 weight rows:
//   tmm0 (A)     = the rows' codes of s: 16 rows x KB bytes (KB = 32 codes, or 16: NSUB = 16), row
//                  stride nb * 256 (one row's codes, tile_loop's layout);
//   tmm1, 2 (B)  = v's panel dwords of s: KB / 4 rows x LANES dwords (the panel's rows ARE the VNNI
//                  layout: ActSBT::q[dw], token l's 4 bytes in dword lane l);
//   tmm4, 5 (C)  = 0, then C += A . B: TDPBUSD for D::UW (codes unsigned 0..31, activations signed),
//                  TDPBSUD otherwise (codes signed, activations + 128 unsigned): dt[r][l], exactly
//                  mk_gemm's sub-block dot (int32, |dt| < 2^21).
// (B and C alternate between two tiles with the sub-block's parity, so that a sub-block's product
// need not wait for the vector unit to have read the previous one's C.) Each C goes to an L1
// buffer (16 rows x LANES int32), and the super-block's integers I[r] = sum_s sc[r][s] * dt_s[r]
// are formed in 16 registers (vpmulld, vpaddd: the scales differ per row and sub-block, which no
// tile op applies), then mins and the float steps as mk_gemm. Rows past R (the last group of a
// tile) compute on stale codes and metadata inside the tile's buffers, and are not stored.
constexpr int AMX_ROWS = 16;
static_assert(kTileRowStep == AMX_ROWS, "tiles of whole 16-row groups");
template <class D>
constexpr int amx_kb() { return 4 * (64 / D::NSUB); }  // bytes of codes per sub-block
// A (tmm0) 16 rows x KB bytes of codes, B (tmm1 ..) KB / 4 rows x LANES dwords, C (tmm4 ..) 16 x LANES
template <int KB>
void amx_configure() {
    static const TileConfig c = [] {  // (built once: not a 64-byte object on every call's stack)
        TileConfig t;
        t.set(0, AMX_ROWS, KB);
        for (int i = 0; i < std::max(2, MAXV); ++i) {  // (mk_amx alternates 2; mk_amx_i2s takes one a lane vector)
            t.set(1 + i, KB / 4, LANES * 4);
            t.set(4 + i, AMX_ROWS, LANES * 4);
        }
        return t;
    }();
    tile_loadconfig(c);
}
// The A tiles' layout (every amx microkernel): a decoded tile's rows (row_bytes of codes each, one
// after another) -> per 16-row group and chunk of KB bytes along K, the group's 16 chunks one after
// another, so that an A tile is one contiguous 16 x KB block (a load of stride KB). Read in place,
// 16 rows a multiple of 4 KB apart (n = 4096: Q4_K's 16 super-blocks, Q4_0's 128 blocks) fall in
// one L1 set and 16 streams for the prefetchers; laid out so, one stream (BENCHMARKS.md round 23
// has its measured effect). Group g's chunk k is at dst + g * 16 * row_bytes + k * 16 * KB:
// the group's base is where its first row was (i0 * row_bytes), so the callers' offsets stand.
// Rows past `rows` in the last group stay as they were (computed on, never stored).
template <int KB>
void amx_tile_layout(const uint8_t *src, size_t row_bytes, int64_t rows, uint8_t *dst) {
    const size_t nk = row_bytes / KB;
    for (int64_t i = 0; i < rows; ++i) {
        const uint8_t *r = src + (size_t)i * row_bytes;
        uint8_t *d = dst + (size_t)(i / AMX_ROWS) * AMX_ROWS * row_bytes + (size_t)(i % AMX_ROWS) * KB;
        for (size_t k = 0; k < nk; ++k) std::memcpy(d + k * AMX_ROWS * KB, r + k * KB, KB);
    }
}
// C (tile 4 + P) = the dots of 16 rows of codes (at u, row stride us) and one lane vector's KB / 4
// panel rows (at q) -> cb (16 rows x LANES int32); UW: TDPBUSD, else TDPBSUD
template <int P, bool UW>
LB_GK_INLINE void amx_dots(const void *u, size_t us, const void *q, int32_t *cb) {
    tile_load<0>(u, us);
    tile_load<1 + P>(q, LANES * 4);
    tile_zero<4 + P>();
    tile_dp<4 + P, 0, 1 + P, UW>();
    tile_store<4 + P>(cb, LANES * 4);
}
// the MINS formats' M of one row and lane vector (mk_gemm forms it for V vectors at once)
template <class D>
LB_GK_INLINE VI mins_sum(const RowSB &m, const ActOf<D> &act) {
    VI M = vset1(0);
    if constexpr (D::MINS) {
        #pragma GCC unroll 8
        for (int p = 0; p < BsPairs<D>::value; ++p) M = vdot16(M, vld((const void *)act.bs[p]), vset1(m.mn[p]));
    }
    return M;
}
// Sub-block s's dots of the 16 rows (the super-block's codes at u, amx_tile_layout's) and one lane
// vector (act) through tiles C = 4 + P, B = 1 + P, into cb; then I[r] (+)= sc[r][s] * dt[r]
template <class D, int P>
LB_GK_INLINE void amx_sub_block(const uint8_t *u, const ActOf<D> &act, const RowSB *m, size_t ms, int s,
                                int32_t *cb, VI (&I)[AMX_ROWS]) {
    constexpr int DW = 64 / D::NSUB, KB = amx_kb<D>();
    amx_dots<P, D::UW>(u + (size_t)s * AMX_ROWS * KB, KB, act.q[s * DW], cb);
    #pragma GCC unroll 16
    for (int r = 0; r < AMX_ROWS; ++r) {
        const VI p = vmullo(vld(cb + (size_t)r * LANES), vset1(m[(size_t)r * ms].sc[s]));
        I[r] = s == 0 ? p : vadd(I[r], p);
    }
}
// 16 rows (R of them stored) x V lane vectors -> res (mk_gemm's layout)
template <class D>
__attribute__((noinline)) void mk_amx(const uint8_t *u0, const RowSB *m0, const ActOf<D> *act0, int64_t nb, int R, int V,
                                      float *res) {
    static_assert(D::NSUB % 2 == 0, "sub-blocks in pairs (tiles alternate)");
    alignas(64) int32_t cb[2][AMX_ROWS * LANES];
    const size_t ms = (size_t)nb;
    for (int v = 0; v < V; ++v) {
        const ActOf<D> *act = act0 + (size_t)v * ms;
        for (int r = 0; r < R; ++r) fst(res + (size_t)(r * MAXV + v) * LANES, fzero());
        for (int64_t b = 0; b < nb; ++b) {
            VI I[AMX_ROWS];
            const uint8_t *u = u0 + (size_t)b * AMX_ROWS * QK;  // (amx_tile_layout's: the super-block's chunks)
            const RowSB *m = m0 + b;
            for (int s = 0; s < D::NSUB; s += 2) {
                amx_sub_block<D, 0>(u, act[b], m, ms, s, cb[0], I);
                amx_sub_block<D, 1>(u, act[b], m, ms, s + 1, cb[1], I);
            }
            #pragma GCC unroll 16
            for (int r = 0; r < AMX_ROWS; ++r)
                if (r < R) float_step<D>(I[r], mins_sum<D>(m[(size_t)r * ms], act[b]), m[(size_t)r * ms], act[b].d,
                                         res + (size_t)(r * MAXV + v) * LANES);
        }
    }
    final_step<D>(R, V, res);
}

// The unsigned-code formats whose scale times code fits a byte, whole or in two parts (D::SCMAX:
// Q2_K's 4-bit scales x codes 0..3 <= 45; Q4_K's / Q5_K's 6-bit scales split as sc = (sc & 7) + 8 *
// (sc >> 3), each part x codes 0..31 <= 217): the tile decode folds the scales into the codes
// (amx_scale_codes), so
//   I = sum_k (sc u)_k q_k = C0 + 8 * C1,   Cj = sum_k (part_j(sc) u)_k q_k
// the same exact integer (I8), and a super-block's dots are 4 tile products of K = 64 per part,
// accumulated in the tiles, with no per-sub-block vector work (mk_amx's vpmulld per sub-block and
// row). amx_parts<D>(): 1, 2, or 0 (mk_amx).
template <class D, class = void>
struct ScMax : std::integral_constant<int, 0> {};
template <class D>
struct ScMax<D, std::void_t<decltype(D::SCMAX)>> : std::integral_constant<int, D::SCMAX> {};
template <class D>
constexpr int amx_parts() {
    if constexpr (!D::UW || ScMax<D>::value == 0) return 0;
    else if constexpr (ScMax<D>::value * D::WMAX <= 255) return 1;
    else if constexpr (ScMax<D>::value <= 63 && 7 * D::WMAX <= 255) return 2;
    else return 0;
}
// Rows' codes u (nb super-blocks each, rows one after another) -> part 0 at t0, part 1 at t1
// (parts 2), in amx_tile_layout<64>'s layout: bytes (sc & 7) * u and (sc >> 3) * u, or (parts 1)
// sc * u. One vpmullw per 16 code pairs: a word (u_lo + 256 u_hi) times p is the two bytes'
// products exactly while each is <= 255.
// (avx512: the super-block's 256 codes as four zmm of 64, each its two chunks' 32 word products
// against a word vector of their sub-blocks' scale parts, vpermw'd from the 16 scales: ~30
// instructions a super-block where 32 codes at a time took ~130; the emulated level: 32 at a time)
template <class D, int J>
__attribute__((noinline)) void amx_scale_codes(const uint8_t *u0, uint8_t *t0, uint8_t *t1, const RowSB *meta,
                                               int64_t rows, int64_t nb) {
#if defined(__AVX512BW__)
    // word w of zmm k (64 codes: chunks 2k, 2k + 1) takes sub-block 2k + w / 16 (NSUB 8) or 4k + w / 8 (16)
    alignas(64) static constexpr int16_t kW8[32] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    alignas(64) static constexpr int16_t kW16[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    const __m512i w0 = _mm512_load_si512(D::NSUB == 8 ? kW8 : kW16);
    constexpr int KS = D::NSUB == 8 ? 2 : 4;  // sub-blocks per zmm
    for (int64_t i = 0; i < rows * nb; ++i) {
        const int64_t row = i / nb, b = i % nb;
        const uint8_t *p = u0 + (size_t)i * QK;
        const size_t o = (size_t)(row / AMX_ROWS) * AMX_ROWS * (size_t)nb * QK + (size_t)b * AMX_ROWS * QK +
                         (size_t)(row % AMX_ROWS) * 64;
        // the 16 scales as words (|sc| <= 63), one word vector per part in the low 16 lanes
        const __m512i sc = _mm512_castsi256_si512(_mm512_cvtepi32_epi16(_mm512_load_si512(meta[i].sc)));
        const __m512i lo = J == 1 ? sc : _mm512_and_si512(sc, _mm512_set1_epi16(7)), hi = _mm512_srli_epi16(sc, 3);
        #pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {  // chunk kc = k of 64 codes: at o + k * 16 * 64
            const __m512i u = _mm512_loadu_si512(p + 64 * k), ix = _mm512_add_epi16(w0, _mm512_set1_epi16((short)(KS * k)));
            _mm512_storeu_si512(t0 + o + (size_t)k * AMX_ROWS * 64, _mm512_mullo_epi16(u, _mm512_permutexvar_epi16(ix, lo)));
            if constexpr (J == 2)
                _mm512_storeu_si512(t1 + o + (size_t)k * AMX_ROWS * 64, _mm512_mullo_epi16(u, _mm512_permutexvar_epi16(ix, hi)));
        }
    }
#else
    for (int64_t i = 0; i < rows * nb; ++i) {
        const RowSB &m = meta[i];
        const int64_t row = i / nb, b = i % nb;
        const uint8_t *p = u0 + (size_t)i * QK;
        // the super-block's chunk kc of 64 codes of this row: at o + kc * 16 * 64
        const size_t o = (size_t)(row / AMX_ROWS) * AMX_ROWS * (size_t)nb * QK + (size_t)b * AMX_ROWS * QK +
                         (size_t)(row % AMX_ROWS) * 64;
        for (int c = 0; c < 8; ++c) {  // 32 codes: one sub-block (NSUB 8) or two (NSUB 16)
            const int s0 = D::NSUB == 8 ? c : 2 * c, s1 = D::NSUB == 8 ? c : 2 * c + 1;
            const __m256i u = _mm256_loadu_si256((const __m256i *)(p + 32 * c));
            const auto by = [&](int a, int b) {
                return _mm256_mullo_epi16(u, _mm256_setr_m128i(_mm_set1_epi16((short)a), _mm_set1_epi16((short)b)));
            };
            const int sa = m.sc[s0], sb = m.sc[s1];
            const size_t at = o + (size_t)(c / 2) * AMX_ROWS * 64 + (size_t)(c % 2) * 32;
            if constexpr (J == 1) {
                _mm256_storeu_si256((__m256i *)(t0 + at), by(sa, sb));
            } else {
                _mm256_storeu_si256((__m256i *)(t1 + at), by(sa >> 3, sb >> 3));
                _mm256_storeu_si256((__m256i *)(t0 + at), by(sa & 7, sb & 7));
            }
        }
    }
#endif
}
// Rows per row tile of the scaled GEMM: its parts and metadata (a pass re-reads them all, from L2)
// in about 1.25 MB of the 2 MB L2, a multiple of 16 in 16..128. Each pass streams the tile's
// super-blocks of the chunk's panel (V x 4.3 KB each, from L3 at 512 tokens: 2.2 MB at n = 4096),
// so rows per tile are the panel's reuse: 48 rows at tile_rows' 256 KB of codes and metadata, 96
// here (n = 4096), 16 and 32 at n = 14336. Q4_K_R8, n = 4096, 1024 rows, 512 tokens, one thread,
// us per row and token (tools/ab_gemm_inproc.py, alternated builds): 48 rows 0.0145-0.0153, 80
// 0.0134-0.0138, 96 0.0130-0.0140, 112 0.0126-0.0139 (BENCHMARKS.md round 25).
constexpr int64_t amx_scaled_rows(int64_t nb, int J) {
    const size_t per_row = (size_t)nb * ((size_t)J * QK + sizeof(RowSB));
    return std::clamp<int64_t>((int64_t)(1310720 / per_row) & ~(int64_t)(AMX_ROWS - 1), AMX_ROWS, 128);
}
// Tiles: A_j = tmm j (part j's codes, 16 rows x 64 bytes), B_w = tmm 2 + w (lane vector w's 16
// panel dwords), C_jw = tmm 4 + j + 2 w (16 rows x LANES int32), for two lane vectors at a time
template <int J>
void amx_configure_scaled() {
    static const TileConfig c = [] {
        TileConfig t;
        for (int j = 0; j < J; ++j) t.set(j, AMX_ROWS, 64);
        for (int w = 0; w < 2; ++w) {
            t.set(2 + w, 16, LANES * 4);
            for (int j = 0; j < J; ++j) t.set(4 + j + 2 * w, AMX_ROWS, LANES * 4);
        }
        return t;
    }();
    tile_loadconfig(c);
}
// Super-block b's tile products for W lane vectors: C_jw = sum over its 4 chunks of 64 codes of
// A_j . B_w. (W = 2: four independent accumulations, so that no product waits on the one before.)
// a, p1: parts 0 and 1 of the super-block (amx_tile_layout's: chunk kc at + kc * 16 * 64)
template <class D, int J, int W>
LB_GK_INLINE void amx_scaled_tiles(const uint8_t *a, const uint8_t *p1, const ActOf<D> *const *act, int64_t b) {
    tile_zero<4>();
    if constexpr (J > 1) tile_zero<5>();
    if constexpr (W > 1) tile_zero<6>();
    if constexpr (J > 1 && W > 1) tile_zero<7>();
    #pragma GCC unroll 4
    for (int kc = 0; kc < 4; ++kc) {  // 64 codes: 16 dwords of the panel
        tile_load<2>(act[0][b].q[16 * kc], LANES * 4);
        if constexpr (W > 1) tile_load<3>(act[W - 1][b].q[16 * kc], LANES * 4);
        tile_load<0>(a + AMX_ROWS * 64 * kc, 64);
        tile_dp<4, 0, 2, true>();
        if constexpr (W > 1) tile_dp<6, 0, 3, true>();
        if constexpr (J > 1) {
            tile_load<1>(p1 + AMX_ROWS * 64 * kc, 64);
            tile_dp<5, 1, 2, true>();
            if constexpr (W > 1) tile_dp<7, 1, 3, true>();
        }
    }
}
// C_jw -> cb + (w * J + j) * 16 * LANES (16 rows x LANES int32 each)
template <int J, int W>
LB_GK_INLINE void amx_scaled_store(int32_t *cb) {
    constexpr size_t T = (size_t)AMX_ROWS * LANES;
    tile_store<4>(cb, LANES * 4);
    if constexpr (J > 1) tile_store<5>(cb + T, LANES * 4);
    if constexpr (W > 1) tile_store<6>(cb + J * T, LANES * 4);
    if constexpr (J > 1 && W > 1) tile_store<7>(cb + (J + 1) * T, LANES * 4);
}
// Super-block b's float steps from its stored products (cb): I = C_0w + 8 C_1w (parts 2) per row
template <class D, int J, int W>
LB_GK_INLINE void amx_scaled_epilogue(const int32_t *cb, const RowSB *m, size_t ms, const ActOf<D> *const *act,
                                      int64_t b, int R, float *res) {
    constexpr size_t T = (size_t)AMX_ROWS * LANES;
    #pragma GCC unroll 2
    for (int w = 0; w < W; ++w)
        #pragma GCC unroll 16
        for (int r = 0; r < AMX_ROWS; ++r)
            if (r < R) {
                VI I = vld(cb + (size_t)w * J * T + (size_t)r * LANES);
                if constexpr (J > 1) I = vadd(I, vsll3(vld(cb + (size_t)(w * J + 1) * T + (size_t)r * LANES)));
                float_step<D>(I, mins_sum<D>(m[(size_t)r * ms], act[w][b]), m[(size_t)r * ms], act[w][b].d,
                              res + (size_t)(r * MAXV + w) * LANES);
            }
}
// One pass over a row tile: R rows (<= 64, in groups of 16; rows past R computed on, not stored) x
// V lane vectors of scaled codes (parts 0 and 1 at a0, a1: amx_tile_layout's, group g at g * 16 *
// nb * 256) -> res (row r, lane vector v at (r * MAXV + v) * LANES). Steps of (super-block b, group
// g, two lane vectors), super-blocks outermost: b's panel (V x 4 KB) stays in L1 across the groups
// and a group's codes of b (J x 4 KB) across its lane vectors (a group at a time over the whole row
// streamed both from L2 for every product). Software-pipelined: a step's tile products are issued
// before the previous step's float steps, which read its stored products (cb, two buffers), so
// the tiles and the vector unit work side by side.
template <class D, int J>
__attribute__((noinline)) void mk_amx_scaled(const uint8_t *a0, const uint8_t *a1, const RowSB *m0, const ActOf<D> *act0,
                                             int64_t nb, int R, int V, float *res) {
    static_assert(D::UW && (J == 1 || J == 2), "unsigned scaled codes in one or two parts");
    struct Step {
        int64_t b;
        int g, v, w;
    };
    const int G = (R + AMX_ROWS - 1) / AMX_ROWS;
    const size_t gs = (size_t)AMX_ROWS * (size_t)nb * QK, SB = (size_t)AMX_ROWS * QK;
    alignas(64) int32_t cb[2][2 * J * AMX_ROWS * LANES];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) fst(res + (size_t)(r * MAXV + v) * LANES, fzero());
    const auto acts = [&](const Step &s, const ActOf<D> *(&act)[2]) {
        act[0] = act0 + (size_t)s.v * (size_t)nb, act[1] = act0 + (size_t)(s.v + s.w - 1) * (size_t)nb;
    };
    const auto issue = [&](const Step &s) {
        const ActOf<D> *act[2];
        acts(s, act);
        const uint8_t *a = a0 + (size_t)s.g * gs + (size_t)s.b * SB, *p = a1 + (size_t)s.g * gs + (size_t)s.b * SB;
        if (s.w == 2) amx_scaled_tiles<D, J, 2>(a, p, act, s.b);
        else amx_scaled_tiles<D, J, 1>(a, p, act, s.b);
    };
    const auto store = [&](const Step &s, int32_t *c) {
        if (s.w == 2) amx_scaled_store<J, 2>(c);
        else amx_scaled_store<J, 1>(c);
    };
    const auto epilogue = [&](const Step &s, const int32_t *c) {
        const ActOf<D> *act[2];
        acts(s, act);
        const int rg = std::min(AMX_ROWS, R - s.g * AMX_ROWS);
        const RowSB *m = m0 + (size_t)s.g * AMX_ROWS * (size_t)nb + (size_t)s.b;
        float *o = res + (size_t)(s.g * AMX_ROWS * MAXV + s.v) * LANES;
        if (s.w == 2) amx_scaled_epilogue<D, J, 2>(c, m, (size_t)nb, act, s.b, rg, o);
        else amx_scaled_epilogue<D, J, 1>(c, m, (size_t)nb, act, s.b, rg, o);
    };
    Step prev{0, 0, 0, 0};
    int k = 0;
    for (int64_t b = 0; b < nb; ++b)
        for (int g = 0; g < G; ++g)
            for (int v = 0; v < V; v += 2) {
                const Step s{b, g, v, std::min(2, V - v)};
                issue(s);
                if (prev.w) epilogue(prev, cb[k ^ 1]);
                store(s, cb[k]);
                prev = s, k ^= 1;
            }
    epilogue(prev, cb[k ^ 1]);
    final_step<D>(R, V, res);
}
#endif

// The k-quant-family formats whose GEMM the amx level replaces: the scaled ones (mk_amx_scaled)
// and those of 8 sub-blocks (mk_amx). The 16-sub-block formats' mk_amx (Q6_K, Q3_K, IQ2_XS,
// IQ2_S, IQ1_M: a tile product of K = 16 and 16 rows x (load, vpmulld, vpaddd) per sub-block)
// ran 0.68-0.83x the avx512 GEMM (`bench kernels`, n = 4096, 64 and 512 tokens, Sapphire
// Rapids-class: BENCHMARKS.md round 23): the level below's GEMM stays for them.
template <class D>
constexpr bool amx_takes() {
#if defined(LOWBIT_AMX)
    return amx_parts<D>() > 0 || D::NSUB == 8;
#else
    return true;
#endif
}

template <class D, size_t BYTES>
void gemm_kq(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    static thread_local Scratch act_s, row_s;
#if defined(LOWBIT_AMX)
    static thread_local Scratch tiled_s, part_s, meta_s;  // (the A tiles' codes: amx_tile_layout; the scaled codes' second part)
#endif
    static thread_local ActKey key;  // (the panel: kernels.h act_holds)
    const int64_t nb = a.n / QK;
    const int ng = (nt + LANES - 1) / LANES;
    using Act = ActOf<D>;
    Act *panel = (Act *)act_s.get((size_t)ng * (size_t)nb * sizeof(Act));
    if (!act_holds(key, a, nt)) build_act_panel<!D::UW>(a.act, a.act_stride, nt, nb, panel);
    const size_t per_row = (size_t)nb * (QK + sizeof(RowSB));
#if defined(LOWBIT_AMX)
    if constexpr (amx_parts<D>() > 0) {  // the scales folded into the codes at the tile's decode
        constexpr int J = amx_parts<D>();
        // Row tiles sized by what a pass re-reads from L2, the parts and the metadata (amx_scaled_rows);
        // each 16 rows decoded into a 16-row buffer of codes and scaled from there into the parts
        const int64_t RT = amx_scaled_rows(nb, J);
        uint8_t *codes = (uint8_t *)row_s.get((size_t)AMX_ROWS * (size_t)nb * QK);
        RowSB *meta = (RowSB *)meta_s.get((size_t)RT * (size_t)nb * sizeof(RowSB) + tile_res_floats(RT) * sizeof(float));
        float *tres = (float *)(meta + (size_t)RT * (size_t)nb);
        // the scaled codes in the A tiles' layout: part 0, and part 1 in a second region
        uint8_t *part0 = (uint8_t *)tiled_s.get((size_t)RT * (size_t)nb * QK);
        uint8_t *part1 = J > 1 ? (uint8_t *)part_s.get((size_t)RT * (size_t)nb * QK) : part0;
        amx_configure_scaled<J>();
        // (one call a pass for the tile's rows: mk_amx_scaled orders its steps over them)
        tile_loop(a, r0, r1, RT, (int)RT, (int)RT, MAXV, nt, tres,
                  [&](int64_t rb, int64_t re) {
                      for (int64_t g = rb; g < re; g += AMX_ROWS) {
                          const int64_t ge = std::min(g + AMX_ROWS, re);
                          const size_t at = (size_t)(g - rb) * (size_t)nb;  // (the group's rows in the tile)
                          decode_tile<D, BYTES>(a, g, ge, nb, codes, meta + at);
                          amx_scale_codes<D, J>(codes, part0 + at * QK, part1 + at * QK, meta + at, ge - g, nb);
                      }
                  },
                  [&](int64_t i0, int R, int g0, int V, float *res) {
                      mk_amx_scaled<D, J>(part0 + (size_t)i0 * (size_t)nb * QK, part1 + (size_t)i0 * (size_t)nb * QK,
                                          meta + (size_t)i0 * (size_t)nb, panel + (size_t)g0 * (size_t)nb, nb, R, V, res);
                  });
        tile_release();
        return;
    }
#endif
    const int64_t RT = tile_rows(per_row);
    uint8_t *codes = (uint8_t *)row_s.get((size_t)RT * per_row + tile_res_floats(RT) * sizeof(float));
    RowSB *meta = (RowSB *)(codes + (size_t)RT * (size_t)nb * QK);
    float *tres = (float *)(meta + (size_t)RT * (size_t)nb);
#if defined(LOWBIT_AMX)
    uint8_t *tiled = (uint8_t *)tiled_s.get((size_t)RT * (size_t)nb * QK);
    amx_configure<amx_kb<D>()>();  // per call and thread (the configuration is a thread's); released below
    tile_loop(a, r0, r1, RT, AMX_ROWS, AMX_ROWS, MAXV, nt, tres,
              [&](int64_t rb, int64_t re) {
                  decode_tile<D, BYTES>(a, rb, re, nb, codes, meta);
                  amx_tile_layout<amx_kb<D>()>(codes, (size_t)nb * QK, re - rb, tiled);
              },
              [&](int64_t i0, int R, int g0, int V, float *res) {
                  mk_amx<D>(tiled + (size_t)i0 * (size_t)nb * QK, meta + (size_t)i0 * (size_t)nb,
                            panel + (size_t)g0 * (size_t)nb, nb, R, V, res);
              });
    tile_release();
#else
    alignas(64) static thread_local VI il1[MAXR_KQ * MAXV];  // (mk_gemm's kIL1)
    VI *const isums = il1;
    tile_loop(a, r0, r1, RT, MAXR_KQ, MAXR1, kq_pv<D>(), nt, tres, [&](int64_t rb, int64_t re) { decode_tile<D, BYTES>(a, rb, re, nb, codes, meta); },
              [&](int64_t i0, int R, int g0, int V, float *res) {
                  (V == 1 ? kMk1<D>[R] : kMk<D>[R][V])(codes + (size_t)i0 * (size_t)nb * QK, meta + (size_t)i0 * (size_t)nb,
                               panel + (size_t)g0 * (size_t)nb, nb, res, isums);
              });
#endif
}

// ============================================================================================
// Legacy formats: Q4_0, Q5_0, Q8_0 x Q8_0 and Q4_1, Q5_1 x Q8_1 (blocks of 32)
// ============================================================================================
// The row kernels' arithmetic (csrc/x86/legacy.inl's header), per (row, token): block b's exact
// isum and S = d_w * d_a, dealt into 8 classes c = b mod 8 of float accumulators,
//   acc_c = fma((float)isum, S, acc_c)   then, Q4_1 / Q5_1: acc_c = fma(m_w, s_a, acc_c)
// in block order, and the result ((acc_0 + acc_1) + (acc_2 + acc_3)) + ((acc_4 + acc_5) +
// (acc_6 + acc_7)). Here the classes are taken one after another (class c: blocks c, c + 8, ...,
// in order), tokens in lanes as above; the weights are decoded to SIGNED bytes w (Q4_0: q - 8,
// Q5_0: q - 16, Q8_0: q, Q4_1 / Q5_1: q), the activations carry +128, and the +128 comes back as 128 * sum(w) per row
// and block (the dots start from -128 * sum(w)). isum = sum w * q_a exactly: the row kernels'
// integer. Bounds: |sum (q_a + 128) w| <= 32 * 255 * 128 < 2^21.
// Q4_1 / Q5_1 at avx2 (D::UW, kUnsignedCodes): codes q unsigned against the activations signed (no
// +128 in the panel, neg = 0), isum the same integer.
// Q8_0 at avx2 (D::SIGN: its codes exceed vdot's W_MAX) takes the sign trick instead (vdot_sign):
// the panel keeps the activations signed (no +128, so no correction: neg = 0) and the tile holds
// 64 bytes per block, the 32 |w| then the 32 w; isum is the avx2 window kernels' integer, bitwise
// (|isum| <= 32 * 128 * 128 = 2^19).

struct alignas(64) ActBlk {
    uint8_t q[8][LANES * 4];  // [dword][lane l * 4 + k]: token l's q[4 dword + k] + 128 (D::SIGN, D::UW: q)
    float d[LANES];           // [lane] d_a (fp16 -> float); 0 for lanes past the chunk
    float s[LANES];           // [lane] s_a of Q8_1 (fp16 -> float); 0 for Q8_0
};
// Rows per microkernel: MAXR, or MAXR_SIGN for the sign trick (measured, at vdot_sign);
// MAXR_LEG sizes the class and result buffers for either.
// D::UW (kUnsignedCodes): Q4_1's int16 sums take a whole block (one vpmaddwd into the float
// step, no int32 sum kept across the block), so 6 rows fit the 16 ymm (int16 sums and float
// accumulators: 12); Q5_1's take half a block (an int32 sum per row and token as well): 4 rows, 5
// spilled. Zen 3, in-process interleaved builds, 1 thread, Q4_1 at 256 tokens (n = 2304) and
// Q4_1_R8 at 128 (n = 576), medians: 3 rows (the +128 panel) 1.00, 4 rows 1.10-1.13x, 5 rows
// 1.14-1.19x; 6 against 5 at 256 tokens, n = 576: 1.05-1.09x (n = 2304: even). Q5_1 3 rows 1.27x,
// 4 rows 1.33x. Q4_0 (kNegLast) 5 rows: 1.04-1.09x its 3 at 256 tokens (n = 2304), 1.14x at 128
// (n = 576); 6 even with 5 (BENCHMARKS.md round (19)).
template <class D>
constexpr int kMr = D::SIGN ? MAXR_SIGN : D::UW ? uw_rows(D::WMAX) : kNegLast<D> ? MAXR_NEGLAST : MAXR;
constexpr int MAXR_LEG = std::max({MAXR_SIGN, MAXR, MAXR_UW, MAXR_NEGLAST});
// avx2 (LB_GK_KQ_V2): the formats whose int16 sums take a whole block (Q4_0, Q4_1 and their R8
// layouts: no int32 sum kept across a block) also take passes of 2 lane vectors x MAXR_LEG2 rows,
// their 8 classes' float accumulators in L1 (cls) where the registers go to the 2 x 4 int16 sums
// (mk_gemm_legacy's kAL1); the others keep passes of 1 (leg_pv)
#if defined(LB_GK_KQ_V2)
constexpr int MAXR_LEG2 = 4;
template <class D>
constexpr int leg_pv() { return !D::SIGN && presum_k<D>() >= 8 ? 2 : 1; }
#else
constexpr int MAXR_LEG2 = MAXR;
template <class D>
constexpr int leg_pv() { return MAXV_LEG; }
#endif

struct RowBlk {
    int32_t neg;       // -128 * sum(w) (D::SIGN, D::UW: 0, unread)
    float d, m;        // d_w, m_w (Q4_1; 0 otherwise)
};

struct GQ4_0 {
    static constexpr size_t BYTES = 18;
    static constexpr bool Q8_1 = false, M = false, SIGN = false, UW = false;
    static constexpr int WMAX = 8;  // codes q - 8: -8..7
    static constexpr int CODES = 32;  // tile bytes per block
    static LB_GK_INLINE void decode(const uint8_t *x, int8_t *w, RowBlk &m) {
        const __m128i q = _mm_loadu_si128((const __m128i *)(x + 2));
        const __m128i k0F = _mm_set1_epi8(0x0F), k8 = _mm_set1_epi8(8);
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, k0F), k8);
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), k0F), k8);
        _mm_storeu_si128((__m128i *)w, lo);
        _mm_storeu_si128((__m128i *)(w + 16), hi);
        m.neg = -128 * wsum32(lo, hi);
        m.d = f16(x), m.m = 0.0f;
    }
};
struct GQ4_1 {
    static constexpr size_t BYTES = 20;
    static constexpr bool Q8_1 = true, M = true, SIGN = false, UW = kUnsignedCodes;
    static constexpr int WMAX = 15;  // codes q: 0..15
    static constexpr int CODES = 32;
    static LB_GK_INLINE void decode(const uint8_t *x, int8_t *w, RowBlk &m) {
        const __m128i q = _mm_loadu_si128((const __m128i *)(x + 4));
        const __m128i k0F = _mm_set1_epi8(0x0F);
        const __m128i lo = _mm_and_si128(q, k0F), hi = _mm_and_si128(_mm_srli_epi16(q, 4), k0F);
        _mm_storeu_si128((__m128i *)w, lo);
        _mm_storeu_si128((__m128i *)(w + 16), hi);
        m.neg = UW ? 0 : -128 * wsum32(lo, hi);
        m.d = f16(x), m.m = f16(x + 2);
    }
};
// Q5_0 / Q5_1: bit j of the block's little-endian qh word is weight j's fifth bit (value 16)
// (csrc/ref/legacy.cpp); byte j of the result is 0x10 where bit j of `bits` (16 of them) is set
LB_GK_INLINE __m128i fifth_bits16(uint32_t bits) {
    const __m128i spread = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)bits),
                                            _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(spread, bit), bit), _mm_set1_epi8(0x10));
}
// the 32 five-bit codes 0..31 of a Q5 block: qs nibbles (weights j, j + 16) plus the fifth bits
LB_GK_INLINE void codes5(const uint8_t *qh, const uint8_t *qs, __m128i &lo, __m128i &hi) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
    const __m128i q = _mm_loadu_si128((const __m128i *)qs), k0F = _mm_set1_epi8(0x0F);
    lo = _mm_or_si128(_mm_and_si128(q, k0F), fifth_bits16(h & 0xFFFFu));
    hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q, 4), k0F), fifth_bits16(h >> 16));
}
struct GQ5_0 {
    static constexpr size_t BYTES = 22;  // d, qh[4], qs[16]
    static constexpr bool Q8_1 = false, M = false, SIGN = false, UW = false;
    static constexpr int WMAX = 16;  // codes q - 16: -16..15
    static constexpr int CODES = 32;
    static LB_GK_INLINE void decode(const uint8_t *x, int8_t *w, RowBlk &m) {
        __m128i lo, hi;
        codes5(x + 2, x + 6, lo, hi);
        const __m128i k16 = _mm_set1_epi8(16);
        lo = _mm_sub_epi8(lo, k16), hi = _mm_sub_epi8(hi, k16);
        _mm_storeu_si128((__m128i *)w, lo);
        _mm_storeu_si128((__m128i *)(w + 16), hi);
        m.neg = -128 * wsum32(lo, hi);
        m.d = f16(x), m.m = 0.0f;
    }
};
struct GQ5_1 {
    static constexpr size_t BYTES = 24;  // d, m, qh[4], qs[16]
    static constexpr bool Q8_1 = true, M = true, SIGN = false, UW = kUnsignedCodes;
    static constexpr int WMAX = 31;  // codes q: 0..31
    static constexpr int CODES = 32;
    static LB_GK_INLINE void decode(const uint8_t *x, int8_t *w, RowBlk &m) {
        __m128i lo, hi;
        codes5(x + 4, x + 8, lo, hi);
        _mm_storeu_si128((__m128i *)w, lo);
        _mm_storeu_si128((__m128i *)(w + 16), hi);
        m.neg = UW ? 0 : -128 * wsum32(lo, hi);
        m.d = f16(x), m.m = f16(x + 2);
    }
};
struct GQ8_0 {
    static constexpr size_t BYTES = 34;
    static constexpr bool Q8_1 = false, M = false, UW = false;
    static constexpr int WMAX = 128;  // codes q: -128..127 (too wide for avx2's vdot)
#if defined(LB_GK_SIGN)
    static constexpr bool SIGN = true;  // avx2: the sign trick (vdot_sign): |w| and w per block
#else
    static constexpr bool SIGN = false;
#endif
    static constexpr int CODES = SIGN ? 64 : 32;
    static LB_GK_INLINE void decode(const uint8_t *x, int8_t *w, RowBlk &m) {
        const __m128i lo = _mm_loadu_si128((const __m128i *)(x + 2)), hi = _mm_loadu_si128((const __m128i *)(x + 18));
        if constexpr (SIGN) {  // |w| (vpabsb: -128 -> 0x80, 128 unsigned), then w
            _mm_storeu_si128((__m128i *)w, _mm_abs_epi8(lo));
            _mm_storeu_si128((__m128i *)(w + 16), _mm_abs_epi8(hi));
            _mm_storeu_si128((__m128i *)(w + 32), lo);
            _mm_storeu_si128((__m128i *)(w + 48), hi);
            m.neg = 0;
        } else {
            _mm_storeu_si128((__m128i *)w, lo);
            _mm_storeu_si128((__m128i *)(w + 16), hi);
            m.neg = -128 * wsum32(lo, hi);
        }
        m.d = f16(x), m.m = 0.0f;
    }
};

template <class D, int R, int V>
__attribute__((noinline)) void mk_gemm_legacy(const int8_t *w0, const RowBlk *m0, const ActBlk *act0, int64_t nb,
                                              float *cls, float *res) {
    static_assert(D::SIGN || D::WMAX <= W_MAX, "this level's vdot is not exact for the format's codes");
    const size_t ws = (size_t)nb * D::CODES, ms = (size_t)nb;
#define w(r) (w0 + (size_t)(r) * ws)
#define m(r) (m0 + (size_t)(r) * ms)
#define act(v) (act0 + (size_t)(v) * ms)
    // avx2's passes of 2 vectors (leg_pv): the class's accumulators in L1, at cls (kAL1)
    constexpr bool kAL1 = V > MAXV_LEG;
    for (int c = 0; c < 8; ++c) {
        float *const clsc = cls + (size_t)c * MAXR_LEG * MAXV * LANES;
        VF acc[R][V];
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
            for (int v = 0; v < V; ++v) {
                if constexpr (kAL1) fst(clsc + (size_t)(r * MAXV + v) * LANES, fzero());
                else acc[r][v] = fzero();
            }
        for (int64_t b = c; b < nb; b += 8) {
            VI dt[R][V];
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                const VI neg = D::SIGN || D::UW || kNegLast<D> ? vset1(0) : vset1(m(r)[b].neg);
#pragma GCC unroll 16
                for (int v = 0; v < V; ++v) dt[r][v] = neg;
            }
#if defined(LB_GK_SIGN)
            if constexpr (D::SIGN) {  // Q8_0 at avx2: |w| at + 0, w at + 32 of the block's CODES = 64 bytes
#pragma GCC unroll 8
                for (int g = 0; g < 8; ++g) {
                    VI a[V];
#pragma GCC unroll 16
                    for (int v = 0; v < V; ++v) a[v] = vld((const void *)act(v)[b].q[g]);
#pragma GCC unroll 16
                    for (int r = 0; r < R; ++r) {
                        int32_t wa, wv;
                        std::memcpy(&wa, w(r) + (size_t)b * D::CODES + 4 * g, 4);
                        std::memcpy(&wv, w(r) + (size_t)b * D::CODES + 32 + 4 * g, 4);
                        // (two broadcast loads: vpabsb on one broadcast w instead was 4-6%
                        // slower on Zen 3, an ALU op more per row and dword)
                        const VI wab = vset1(wa), wsg = vset1(wv);
#pragma GCC unroll 16
                        for (int v = 0; v < V; ++v) dt[r][v] = vdot_sign(dt[r][v], a[v], wab, wsg);
                    }
                }
            } else
#endif
#if defined(LB_GK_PRESUM16)
            // Q4_0, Q4_1 (one vpmaddwd per block), Q5_1 (two: D::UW, kUnsignedCodes)
            if constexpr (D::UW || presum16(D::WMAX)) {
                constexpr int K = presum_k<D>();
                static_assert(K >= 4, "the int16 sums of at least 4 dwords");
#pragma GCC unroll 8
                for (int g0 = 0; g0 < 8; g0 += K)
                    vdots16<R, V, D::UW>(dt, g0, std::min(g0 + K, 8),
                                  [&](int v, int g) { return vld((const void *)act(v)[b].q[g]); },
                                  [&](int r, int g) {
                                      int32_t wv;
                                      std::memcpy(&wv, w(r) + (size_t)b * D::CODES + 4 * g, 4);
                                      return wv;
                                  });
                if constexpr (kNegLast<D>)
#pragma GCC unroll 16
                    for (int r = 0; r < R; ++r) {
                        const VI neg = vset1(m(r)[b].neg);
#pragma GCC unroll 16
                        for (int v = 0; v < V; ++v) dt[r][v] = vadd(dt[r][v], neg);
                    }
            } else
#endif
#pragma GCC unroll 8
            for (int g = 0; g < 8; ++g) {
                VI a[V];
#pragma GCC unroll 16
                for (int v = 0; v < V; ++v) a[v] = vld((const void *)act(v)[b].q[g]);
#pragma GCC unroll 16
                for (int r = 0; r < R; ++r) {
                    int32_t wv;
                    std::memcpy(&wv, w(r) + (size_t)b * D::CODES + 4 * g, 4);
                    const VI wb = vset1(wv);
#pragma GCC unroll 16
                    for (int v = 0; v < V; ++v) dt[r][v] = vdot(dt[r][v], a[v], wb);
                }
            }
#pragma GCC unroll 16
            for (int v = 0; v < V; ++v) {
                const VF da = fld(act(v)[b].d);
#pragma GCC unroll 16
                for (int r = 0; r < R; ++r) {
                    float *const o = clsc + (size_t)(r * MAXV + v) * LANES;
                    VF x = kAL1 ? fld(o) : acc[r][v];
                    x = ffma(fcvt(dt[r][v]), fmul(da, fset1(m(r)[b].d)), x);
                    if constexpr (D::M) x = ffma(fset1(m(r)[b].m), fld(act(v)[b].s), x);
                    if constexpr (kAL1) fst(o, x);
                    else acc[r][v] = x;
                }
            }
            if constexpr (kAL1) __asm__ volatile("" ::: "memory");  // the accumulators stay in L1
        }
        if constexpr (!kAL1)
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
                for (int v = 0; v < V; ++v) fst(clsc + (size_t)(r * MAXV + v) * LANES, acc[r][v]);
    }
    // the row kernels' final tree over the classes, lane by lane
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < V; ++v) {
            const size_t o = (size_t)(r * MAXV + v) * LANES, cs = (size_t)MAXR_LEG * MAXV * LANES;
            VF e[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; ++c) e[c] = fldu(cls + c * cs + o);
            const VF t = fadd(fadd(fadd(e[0], e[1]), fadd(e[2], e[3])),
                                           fadd(fadd(e[4], e[5]), fadd(e[6], e[7])));
            fst(res + o, t);
        }
#undef w
#undef m
#undef act
}

template <class D>
using MkLegacyFn = void (*)(const int8_t *, const RowBlk *, const ActBlk *, int64_t, float *, float *);
// mk_gemm_legacy<D, R, V> for R in 1..MR, V in 1..VV (the tails of a tile and of the chunk)
// (avx2's passes of 2 vectors, leg_pv: mk_gemm_legacy<D, R, 2> for R in 1..MAXR_LEG2)
template <class D, int MR, int VV>
LB_GK_INLINE void mk_legacy_v(int R, const int8_t *w0, const RowBlk *m0, const ActBlk *act0, int64_t nb, float *cls,
                              float *res) {
    if constexpr (MR > 1)
        if (R < MR) return mk_legacy_v<D, MR - 1, VV>(R, w0, m0, act0, nb, cls, res);
    mk_gemm_legacy<D, MR, VV>(w0, m0, act0, nb, cls, res);
}
template <class D, int MR = kMr<D>, int VV = MAXV_LEG>
LB_GK_INLINE void mk_legacy(int R, int V, const int8_t *w0, const RowBlk *m0, const ActBlk *act0, int64_t nb,
                            float *cls, float *res) {
    if constexpr (leg_pv<D>() > MAXV_LEG)
        if (V > MAXV_LEG) return mk_legacy_v<D, MAXR_LEG2, leg_pv<D>()>(R, w0, m0, act0, nb, cls, res);
    if constexpr (MR > 1)
        if (R < MR) return mk_legacy<D, MR - 1, VV>(R, V, w0, m0, act0, nb, cls, res);
    if constexpr (VV > 1)
        if (V < VV) return mk_legacy<D, MR, VV - 1>(R, V, w0, m0, act0, nb, cls, res);
    mk_gemm_legacy<D, MR, VV>(w0, m0, act0, nb, cls, res);
}

// nt tokens of Q8_0 (34-byte) or Q8_1 (36-byte) blocks -> ceil(nt / 16) groups of nb ActBlk;
// BIAS: the codes + 128 (vdot's unsigned operand), else as they are (vdot_sign's signed one)
template <bool Q8_1, bool BIAS>
__attribute__((noinline)) void build_act_panel_legacy(const uint8_t *act, size_t act_stride, int nt, int64_t nb,
                                                      ActBlk *panel) {
    constexpr size_t AB = Q8_1 ? 36 : 34, QS = Q8_1 ? 4 : 2;
    constexpr uint32_t X = BIAS ? 0x80808080u : 0u;  // the bias, and the bytes of an absent token's 0
    const int ng = (nt + LANES - 1) / LANES;
    for (int g = 0; g < ng; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            ActBlk &P = panel[(size_t)g * (size_t)nb + (size_t)b];
            for (int l = 0; l < LANES; ++l) {
                const int t = g * LANES + l;
                if (t >= nt) {
                    for (int dw = 0; dw < 8; ++dw) std::memcpy(P.q[dw] + 4 * l, &X, 4);
                    P.d[l] = 0.0f, P.s[l] = 0.0f;
                    continue;
                }
                const uint8_t *y = act + (size_t)t * act_stride + (size_t)b * AB;
                for (int dw = 0; dw < 8; ++dw) {
                    uint32_t v;
                    std::memcpy(&v, y + QS + 4 * dw, 4);
                    v ^= X;
                    std::memcpy(P.q[dw] + 4 * l, &v, 4);
                }
                P.d[l] = f16(y);
                P.s[l] = Q8_1 ? f16(y + 2) : 0.0f;
            }
        }
}

// A legacy format's R8 layout (repack.h; its windows: csrc/x86/{avx2,avx512}/lg_r8.cpp): each block of
// the tile's rows is put back together from its lane of the pair's group (d, m, the code dwords:
// fixed-size copies, once per row and call) and decoded as the format's, so the same codes,
// metadata and results (I8).
template <class D>
struct GR8Rows : D {
    static constexpr bool R8_ROWS = true;
    static constexpr int DWORDS = D::M ? 4 : (int)(D::BYTES - 2) / 4;  // code dwords per block
    static constexpr size_t GROUP = 16 * D::BYTES, QS = D::BYTES - 4 * DWORDS, GQS = D::M ? 64 : 32;
};

template <class D>
__attribute__((noinline)) void decode_tile_legacy(const RowArgs &a, int64_t rb, int64_t re, int64_t nb, int8_t *codes,
                                                  RowBlk *meta) {
    if constexpr (IsR8Rows<D>::value) {
        // group by group, and in a group block by block for its rows in the tile: each pair's
        // lines are read once while in L1 (row by row, a group of 8 rows of 14336 values, 64 KB,
        // came from L2 once per row)
        for (int64_t g0 = rb / kR8Rows * kR8Rows; g0 < re; g0 += kR8Rows) {
            const uint8_t *g = a.w + (size_t)g0 * a.w_stride;
            const int j0 = (int)(std::max(rb, g0) - g0), j1 = (int)(std::min(re, g0 + kR8Rows) - g0);
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t *o = g + (size_t)(b / 2) * D::GROUP;
                for (int j = j0; j < j1; ++j) {
                    const size_t l = (size_t)(2 * j + (int)(b % 2)), i = (size_t)(g0 + j - rb);  // lane; tile row
                    uint8_t x[D::BYTES];
                    std::memcpy(x, o + 2 * l, 2);
                    if constexpr (D::M) std::memcpy(x + 2, o + 32 + 2 * l, 2);
                    for (int k = 0; k < D::DWORDS; ++k) std::memcpy(x + D::QS + 4 * k, o + D::GQS + 64 * (size_t)k + 4 * l, 4);
                    D::decode(x, codes + (i * (size_t)nb + (size_t)b) * D::CODES, meta[i * (size_t)nb + (size_t)b]);
                }
            }
        }
        return;
    }
    for (int64_t r = rb; r < re; ++r) {
        const uint8_t *x = a.w + (size_t)r * a.w_stride;
        int8_t *w = codes + (size_t)(r - rb) * (size_t)nb * D::CODES;
        RowBlk *m = meta + (size_t)(r - rb) * (size_t)nb;
        for (int64_t b = 0; b < nb; ++b) {
            prefetch_tile_ahead(x + (size_t)b * D::BYTES, D::BYTES);
            D::decode(x + (size_t)b * D::BYTES, w + (size_t)b * D::CODES, m[b]);
        }
    }
}

#if defined(LOWBIT_AMX)
// The amx level's legacy microkernel: mk_gemm_legacy's arithmetic (the 8 classes, each block's
// float step, the final tree) with each block's integer from a tile product, per lane vector and
// 16 rows: A = the rows' 32 codes of block b (signed, or unsigned for D::UW), B = the panel's 8
// dwords of b (activations + 128, or signed for D::UW), C = the 16 x LANES dots;
//   isum = C + neg (-128 * sum(w); 0 for D::UW)
//   acc_c = fma((float)isum, d_a * d_w, acc_c)  [Q4_1 / Q5_1: acc_c = fma(m_w, s_a, acc_c)]
// in block order within each class, the classes' 16 row accumulators in registers, then the row
// kernels' tree ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)). Not for D::SIGN (avx2's Q8_0: its
// windows' sign trick wraps where the tiles' products do not; the emulated level keeps avx2's GEMM).
template <class D, int P>
LB_GK_INLINE void amx_block(const int8_t *w0, const RowBlk *m0, size_t ms, const ActBlk &act, int64_t b,
                            int32_t *cb, VF (&acc)[AMX_ROWS]) {
    amx_dots<P, D::UW>(w0 + (size_t)b * AMX_ROWS * D::CODES, D::CODES, act.q[0], cb);  // (amx_tile_layout's)
    const VF da = fld(act.d);
    #pragma GCC unroll 16
    for (int r = 0; r < AMX_ROWS; ++r) {
        const RowBlk &m = m0[(size_t)r * ms + (size_t)b];
        const VI dt = vadd(vld(cb + (size_t)r * LANES), vset1(D::UW ? 0 : m.neg));
        acc[r] = ffma(fcvt(dt), fmul(da, fset1(m.d)), acc[r]);
        if constexpr (D::M) acc[r] = ffma(fset1(m.m), fld(act.s), acc[r]);
    }
}
template <class D>
__attribute__((noinline)) void mk_amx_legacy(const int8_t *w0, const RowBlk *m0, const ActBlk *act0, int64_t nb, int R,
                                             int V, float *res) {
    static_assert(!D::SIGN && D::CODES == 32, "a block's 32 codes as they are");
    alignas(64) int32_t cb[2][AMX_ROWS * LANES];
    alignas(64) float cls[8][AMX_ROWS * LANES];
    const size_t ms = (size_t)nb;
    for (int v = 0; v < V; ++v) {
        const ActBlk *act = act0 + (size_t)v * ms;
        for (int c = 0; c < 8; ++c) {
            VF acc[AMX_ROWS];
            #pragma GCC unroll 16
            for (int r = 0; r < AMX_ROWS; ++r) acc[r] = fzero();
            int64_t b = c;
            for (; b + 8 < nb; b += 16) {  // (tiles alternate block by block)
                amx_block<D, 0>(w0, m0, ms, act[b], b, cb[0], acc);
                amx_block<D, 1>(w0, m0, ms, act[b + 8], b + 8, cb[1], acc);
            }
            if (b < nb) amx_block<D, 0>(w0, m0, ms, act[b], b, cb[0], acc);
            #pragma GCC unroll 16
            for (int r = 0; r < AMX_ROWS; ++r) fst(cls[c] + (size_t)r * LANES, acc[r]);
        }
        for (int r = 0; r < R; ++r) {
            const auto e = [&](int c) { return fld(cls[c] + (size_t)r * LANES); };
            fst(res + (size_t)(r * MAXV + v) * LANES,
                fadd(fadd(fadd(e(0), e(1)), fadd(e(2), e(3))), fadd(fadd(e(4), e(5)), fadd(e(6), e(7)))));
        }
    }
}
#endif

template <class D>
void gemm_legacy(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    static thread_local Scratch act_s, row_s;
    static thread_local ActKey key;  // (the panel: kernels.h act_holds)
    const int64_t nb = a.n / 32;
    const int ng = (nt + LANES - 1) / LANES;
    ActBlk *panel = (ActBlk *)act_s.get((size_t)ng * (size_t)nb * sizeof(ActBlk));
    if (!act_holds(key, a, nt)) build_act_panel_legacy<D::Q8_1, !D::SIGN && !D::UW>(a.act, a.act_stride, nt, nb, panel);
    const size_t per_row = (size_t)nb * (D::CODES + sizeof(RowBlk));
    const int64_t RT = tile_rows(per_row);
    [[maybe_unused]] constexpr int MR = kMr<D>;  // (unused at the amx level)
    const size_t tail = ((size_t)8 * MAXR_LEG * MAXV * LANES + tile_res_floats(RT)) * sizeof(float);  // 8 classes + tres
    int8_t *codes = (int8_t *)row_s.get((size_t)RT * per_row + tail + 64);
    RowBlk *meta = (RowBlk *)(codes + (size_t)RT * (size_t)nb * D::CODES);
    float *cls = (float *)(((uintptr_t)(meta + (size_t)RT * (size_t)nb) + 63) & ~(uintptr_t)63);
    float *tres = cls + (size_t)8 * MAXR_LEG * MAXV * LANES;
#if defined(LOWBIT_AMX)
    (void)cls;
    static thread_local Scratch tiled_s;  // (the A tiles' codes: amx_tile_layout)
    int8_t *tiled = (int8_t *)tiled_s.get((size_t)RT * (size_t)nb * D::CODES);
    amx_configure<32>();  // per call and thread; released below
    tile_loop(a, r0, r1, RT, AMX_ROWS, AMX_ROWS, MAXV_LEG, nt, tres,
              [&](int64_t rb, int64_t re) {
                  decode_tile_legacy<D>(a, rb, re, nb, codes, meta);
                  amx_tile_layout<D::CODES>((const uint8_t *)codes, (size_t)nb * D::CODES, re - rb, (uint8_t *)tiled);
              },
              [&](int64_t i0, int R, int g0, int V, float *res) {
                  mk_amx_legacy<D>(tiled + (size_t)i0 * (size_t)nb * D::CODES, meta + (size_t)i0 * (size_t)nb,
                                   panel + (size_t)g0 * (size_t)nb, nb, R, V, res);
              });
    tile_release();
#else
    tile_loop(a, r0, r1, RT, leg_pv<D>() > MAXV_LEG ? MAXR_LEG2 : MR, MR, leg_pv<D>(), nt, tres,
              [&](int64_t rb, int64_t re) { decode_tile_legacy<D>(a, rb, re, nb, codes, meta); },
              [&](int64_t i0, int R, int g0, int V, float *res) {
                  mk_legacy<D>(R, V, codes + (size_t)i0 * (size_t)nb * D::CODES, meta + (size_t)i0 * (size_t)nb,
                               panel + (size_t)g0 * (size_t)nb, nb, cls, res);
              });
#endif
}

// ============================================================================================
// I2_S x I8_S (BitNet b1.58: 2-bit ternary codes, one float scale per tensor)
// ============================================================================================
// The row kernels' arithmetic (csrc/ref/ternary.cpp): per (row, token) the exact integer
// S = sum_k code_k * q_k (code 0..3) over the whole row, then
//   result = (float)(S - act_sum) / act_scale * w_scale
// (one conversion, one division, one multiplication). Tokens in lanes as above; the codes are
// decoded to bytes 0..3 in natural order (valid as vpdpbusd's signed operand), the activations
// carry +128: raw = S + 128 * sum(codes), exact in int32 for n <= 2^22 (255 * 3 * n).
struct alignas(64) ActI2s {  // one 16-token group's header (the codes follow: n / 4 x 64 bytes)
    float scale[LANES];       // act_scale per lane (1 for lanes past the chunk)
    int32_t sum[LANES];       // act_sum per lane
};

template <int R, int V>
__attribute__((noinline)) void mk_gemm_i2s(const uint8_t *c0, const int32_t *neg, const uint8_t *act0, size_t act_gs,
                                           int64_t n, float w_scale, float *res) {
    const size_t cs = (size_t)n;
#define c(r) (c0 + (size_t)(r) * cs)
#define actq(v) (act0 + (size_t)(v) * act_gs + sizeof(ActI2s))
#define acth(v) ((const ActI2s *)(act0 + (size_t)(v) * act_gs))
#if defined(LB_GK_KQ_V2)
    // avx2: the codes (0..3) are vpmaddubsw's UNSIGNED operand against the activations kept signed in
    // the panel (build_act_panel_i2s<false>: no +128, so no neg), a pair of products within 2 * 3 *
    // 128 = 768, so the int16 sums take K_I2S = 32 dwords (a 128-code chunk: 32 * 768 < 32767) per
    // vpmaddwd; the row's int32 S accumulates in res's own slots (it is one integer per row and lane:
    // the float result replaces it at the end), so R x V = 4 x 2 keep 8 int16 sums in registers
    (void)neg;
    constexpr int K_I2S = 32;
    static_assert(K_I2S * 2 * 3 * 128 <= 32767, "the int16 sums of K_I2S dwords");
    const auto slot = [&](int r, int v) { return res + (size_t)(r * MAXV + v) * LANES; };
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < V; ++v) vst(slot(r, v), vset1(0));
    for (int64_t g0 = 0; g0 < n / 4; g0 += K_I2S) {
        vdots16f<R, V, true>(0, K_I2S, [&](int v, int g) { return vld((const void *)(actq(v) + (size_t)(g0 + g) * LANES * 4)); },
                             [&](int r, int g) {
                                 int32_t wv;
                                 std::memcpy(&wv, c(r) + 4 * (g0 + g), 4);
                                 return wv;
                             },
                             [](int) { return _mm256_set1_epi16(1); },
                             [&](int r, int v, VI x) { vst(slot(r, v), vadd(vld(slot(r, v)), x)); });
        __asm__ volatile("" ::: "memory");  // S stays in res
    }
    const auto S = [&](int r, int v) { return vld(slot(r, v)); };
#else
    VI dt[R][V];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        const VI ng = vset1(neg[r]);
#pragma GCC unroll 16
        for (int v = 0; v < V; ++v) dt[r][v] = ng;
    }
    for (int64_t dw = 0; dw < n / 4; ++dw) {
        VI a[V];
#pragma GCC unroll 16
        for (int v = 0; v < V; ++v) a[v] = vld((const void *)(actq(v) + (size_t)dw * LANES * 4));
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            int32_t wv;
            std::memcpy(&wv, c(r) + 4 * dw, 4);
            const VI wb = vset1(wv);
#pragma GCC unroll 16
            for (int v = 0; v < V; ++v) dt[r][v] = vdot(dt[r][v], a[v], wb);
        }
    }
    const auto S = [&](int r, int v) { return dt[r][v]; };
#endif
    // S (row r, lane vector v's int32 sums) -> (float)(S - act_sum) / act_scale * w_scale
    const VF ws = fset1(w_scale);
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
        const VI sum = vld((const void *)acth(v)->sum);
        const VF sc = fld(acth(v)->scale);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const VF f = fcvt(vsub(S(r, v), sum));
            fst(res + (size_t)(r * MAXV + v) * LANES, fmul(fdiv(f, sc), ws));
        }
    }
#undef c
#undef actq
#undef acth
}

using MkI2sFn = void (*)(const uint8_t *, const int32_t *, const uint8_t *, size_t, int64_t, float, float *);
// (avx2: the passes of 2 vectors x MAXR_KQ rows, as the k-quant GEMM's)
#if defined(LB_GK_KQ_V2)
constexpr int MAXR_I2S = MAXR_KQ;
constexpr MkI2sFn kMkI2s[MAXR_I2S + 1][MAXV + 1] = LB_GK_TABLE_KQ(mk_gemm_i2s<);
#else
constexpr int MAXR_I2S = MAXR;
constexpr MkI2sFn kMkI2s[MAXR_I2S + 1][MAXV + 1] = LB_GK_TABLE(mk_gemm_i2s<);
#endif
constexpr MkI2sFn kMkI2s1[MAXR1 + 1] = LB_GK_TABLE1(mk_gemm_i2s<);  // one-vector passes

// nt I8_S rows (float scale, int32 sum, int8 q[n]) -> ceil(nt / 16) groups of act_gs bytes
// (BIAS: the codes + 128, vdot's unsigned operand; avx2's mk_gemm_i2s keeps them signed)
template <bool BIAS>
__attribute__((noinline)) void build_act_panel_i2s(const uint8_t *act, size_t act_stride, int nt, int64_t n,
                                                   uint8_t *panel, size_t act_gs) {
    const int ng = (nt + LANES - 1) / LANES;
    for (int g = 0; g < ng; ++g) {
        ActI2s &H = *(ActI2s *)(panel + (size_t)g * act_gs);
        uint8_t *q = panel + (size_t)g * act_gs + sizeof(ActI2s);
        for (int l = 0; l < LANES; ++l) {
            const int t = g * LANES + l;
            if (t >= nt) {
                for (int64_t dw = 0; dw < n / 4; ++dw) std::memset(q + (size_t)dw * LANES * 4 + 4 * l, BIAS ? 0x80 : 0, 4);
                H.scale[l] = 1.0f, H.sum[l] = 0;
                continue;
            }
            const uint8_t *y = act + (size_t)t * act_stride;
            std::memcpy(&H.scale[l], y, 4);
            std::memcpy(&H.sum[l], y + 4, 4);
            for (int64_t dw = 0; dw < n / 4; ++dw) {
                uint32_t v;
                std::memcpy(&v, y + I8S_HEADER + 4 * dw, 4);
                if constexpr (BIAS) v ^= 0x80808080u;
                std::memcpy(q + (size_t)dw * LANES * 4 + 4 * l, &v, 4);
            }
        }
    }
}

// Rows [rb, re): codes 0..3 in natural order (per 128 weights, 32 bytes: byte j holds weights
// j, 32 + j, 64 + j, 96 + j in bits 7:6, 5:4, 3:2, 1:0) and -128 * sum(codes) per row.
__attribute__((noinline)) void decode_tile_i2s(const RowArgs &a, int64_t rb, int64_t re, uint8_t *codes, int32_t *neg) {
    const __m256i k3 = _mm256_set1_epi8(3);
    for (int64_t r = rb; r < re; ++r) {
        const uint8_t *x = a.w + (size_t)r * a.w_stride;
        uint8_t *c = codes + (size_t)(r - rb) * (size_t)a.n;
        __m256i acc = _mm256_setzero_si256();
        for (int64_t b = 0; b < a.n / 128; ++b) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x + 32 * b));
            const __m256i c0 = _mm256_and_si256(_mm256_srli_epi16(q, 6), k3), c1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), k3);
            const __m256i c2 = _mm256_and_si256(_mm256_srli_epi16(q, 2), k3), c3 = _mm256_and_si256(q, k3);
            _mm256_storeu_si256((__m256i *)(c + 128 * b), c0);
            _mm256_storeu_si256((__m256i *)(c + 128 * b + 32), c1);
            _mm256_storeu_si256((__m256i *)(c + 128 * b + 64), c2);
            _mm256_storeu_si256((__m256i *)(c + 128 * b + 96), c3);
            const __m256i s = _mm256_add_epi8(_mm256_add_epi8(c0, c1), _mm256_add_epi8(c2, c3));  // <= 12 per byte
            acc = _mm256_add_epi64(acc, _mm256_sad_epu8(s, _mm256_setzero_si256()));
        }
        const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
        neg[r - rb] = (int32_t)(-128 * (_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1)));
    }
}

#if defined(LOWBIT_AMX)
// The amx level's I2_S microkernel: mk_gemm_i2s's arithmetic with the whole row's integer from tile
// products. No per-block scale, so the C tiles accumulate over the whole row: per 64 codes, A =
// 16 rows' codes (bytes 0..3, TDPBSUD's signed operand), B = the lane vector's 16 panel dwords
// (activations + 128, unsigned), C_v += A . B; at the row's end dt = C + neg (-128 * sum(codes)),
// then result = (float)(dt - act_sum) / act_scale * w_scale as the row kernels.
template <int V>
__attribute__((noinline)) void mk_amx_i2s(const uint8_t *c0, const int32_t *neg, const uint8_t *act0, size_t act_gs,
                                          int64_t n, float w_scale, int R, float *res) {
    static_assert(V >= 1 && V <= 3, "tiles 1..3 and 4..6");
    alignas(64) int32_t cb[V][AMX_ROWS * LANES];
    const auto each = [&](auto f) {
        f(std::integral_constant<int, 0>{});
        if constexpr (V > 1) f(std::integral_constant<int, 1>{});
        if constexpr (V > 2) f(std::integral_constant<int, 2>{});
    };
    each([&](auto vc) { tile_zero<4 + decltype(vc)::value>(); });
    for (int64_t k = 0; k < n / 64; ++k) {
        tile_load<0>(c0 + (size_t)k * AMX_ROWS * 64, 64);  // (amx_tile_layout's)
        each([&](auto vc) {
            constexpr int v = decltype(vc)::value;
            tile_load<1 + v>(act0 + (size_t)v * act_gs + sizeof(ActI2s) + (size_t)k * 16 * LANES * 4, LANES * 4);
            tile_dp<4 + v, 0, 1 + v, false>();
        });
    }
    each([&](auto vc) {
        constexpr int v = decltype(vc)::value;
        tile_store<4 + v>(cb[v], LANES * 4);
    });
    const VF ws = fset1(w_scale);
    for (int v = 0; v < V; ++v) {
        const ActI2s *h = (const ActI2s *)(act0 + (size_t)v * act_gs);
        const VI sum = vld((const void *)h->sum);
        const VF sc = fld(h->scale);
        for (int r = 0; r < R; ++r) {
            const VI dt = vadd(vld(cb[v] + (size_t)r * LANES), vset1(neg[r]));
            fst(res + (size_t)(r * MAXV + v) * LANES, fmul(fdiv(fcvt(vsub(dt, sum)), sc), ws));
        }
    }
}
using MkAmxI2sFn = void (*)(const uint8_t *, const int32_t *, const uint8_t *, size_t, int64_t, float, int, float *);
constexpr MkAmxI2sFn kMkAmxI2s[4] = {nullptr, &mk_amx_i2s<1>, &mk_amx_i2s<MAXV >= 2 ? 2 : 1>, &mk_amx_i2s<MAXV >= 3 ? 3 : 1>};
#endif

void gemm_i2s(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    static thread_local Scratch act_s, row_s;
    static thread_local ActKey key;  // (the panel: kernels.h act_holds)
    const int ng = (nt + LANES - 1) / LANES;
    const size_t act_gs = sizeof(ActI2s) + (size_t)(a.n / 4) * LANES * 4;
    uint8_t *panel = (uint8_t *)act_s.get((size_t)ng * act_gs);
#if defined(LB_GK_KQ_V2)
    if (!act_holds(key, a, nt)) build_act_panel_i2s<false>(a.act, a.act_stride, nt, a.n, panel, act_gs);
#else
    if (!act_holds(key, a, nt)) build_act_panel_i2s<true>(a.act, a.act_stride, nt, a.n, panel, act_gs);
#endif
    const int64_t RT = tile_rows((size_t)a.n);
    uint8_t *codes = (uint8_t *)row_s.get((size_t)RT * (size_t)a.n + (size_t)RT * 4 + tile_res_floats(RT) * 4 + 64);
    int32_t *neg = (int32_t *)(codes + (size_t)RT * (size_t)a.n);
    float *tres = (float *)(((uintptr_t)(neg + RT) + 63) & ~(uintptr_t)63);
#if defined(LOWBIT_AMX)
    static_assert(MAXV <= 3, "tiles 1..3 and 4..6");
    static thread_local Scratch tiled_s;  // (the A tiles' codes: amx_tile_layout)
    uint8_t *tiled = (uint8_t *)tiled_s.get((size_t)RT * (size_t)a.n);
    amx_configure<64>();  // per call and thread; released below
    tile_loop(a, r0, r1, RT, AMX_ROWS, AMX_ROWS, MAXV, nt, tres,
              [&](int64_t rb, int64_t re) {
                  decode_tile_i2s(a, rb, re, codes, neg);
                  amx_tile_layout<64>(codes, (size_t)a.n, re - rb, tiled);
              },
              [&](int64_t i0, int R, int g0, int V, float *res) {
                  kMkAmxI2s[V](tiled + (size_t)i0 * (size_t)a.n, neg + i0, panel + (size_t)g0 * act_gs, act_gs, a.n,
                               a.w_scale, R, res);
              });
    tile_release();
#else
    tile_loop(a, r0, r1, RT, MAXR_I2S, MAXR1, MAXV, nt, tres, [&](int64_t rb, int64_t re) { decode_tile_i2s(a, rb, re, codes, neg); },
              [&](int64_t i0, int R, int g0, int V, float *res) {
                  (V == 1 ? kMkI2s1[R] : kMkI2s[R][V])(codes + (size_t)i0 * (size_t)a.n, neg + i0, panel + (size_t)g0 * act_gs, act_gs, a.n,
                               a.w_scale, res);
              });
#endif
}

#define LB_GK_STR2(x) #x
#define LB_GK_STR(x) LB_GK_STR2(x)
// the level's name in its kernels' names: the namespace's, but for the amx emulator's (amx_emu),
// whose kernels are the amx level's, emulated (LOWBIT_KNAME)
#if defined(LOWBIT_KNAME)
#define LB_GK_LEVEL LB_GK_STR(LOWBIT_KNAME)
#else
#define LB_GK_LEVEL LB_GK_STR(LOWBIT_NS)
#endif

// Chunks of at least this many tokens take the GEMM (run_rows, glu_rows, the MoE experts);
// LOWBIT_KQ_GEMM_MIN_NT=N overrides it (read once, at registration; 0 turns the GEMM off).
// Measured on Zen 5 (BENCHMARKS.md, round of 2026-12-05: bench kernels --formats Q4_K,Q5_K,Q6_K
// --nt 9,12,16,24 --n 512,2048,4096 --mb 64 --clock cpu --stat min, windows / gemm), after the
// GEMM's unsigned Q4_K / Q5_K operands and its tile loop:
//   avx512    Q4_K, Q5_K 0.96-1.13 at 9 tokens, 1.14-1.33 at 12, 1.15-1.69 at 16, 1.53-1.79 at 24;
//             Q6_K 0.57-0.71 at 9, 0.92-1.06 at 16, 1.17-1.31 at 24;
//   avx2vnni  Q4_K, Q5_K 0.74-0.98 at 12, 1.09-1.24 at 16, 1.18-1.39 at 24; Q6_K 0.83-0.90 at 16,
//             0.97-1.04 at 24 (and, earlier: 0.87 at 32, 1.08 at 64, 1.29 at 256).
// So 16 for Q4_K and Q5_K at both VNNI levels (12 would gain a little more on Zen 5; Zen 4
// measured 0.99-1.32x at 16 before those changes, so 16 is the margin kept for other CPUs), Q6_K
// from 24 at avx512 and 64 at avx2vnni. Then Q6_K's tile decode took its C with one vpmaddubsw
// per 32 codes (was a vpsadbw and four extracts per 32, and a scalar loop): Zen 5, bench kernels
// --formats Q6_K --nt 12,16,20,24,32,48,64 --n 4096 --mb 16 --cpu 1 --stat min, windows / gemm:
// avx512 1.08, 1.42-1.44, 1.28-1.32, 1.54-1.59, 2.06-2.09, 2.29, 2.27-2.36; avx2vnni 0.86-0.93,
// 1.19-1.29, 1.07-1.12, 1.29-1.43, 1.33-1.51, 1.39-1.56, 1.44-1.58. So Q6_K from 16 at avx512
// (as Q4_K) and 24 at avx2vnni (a margin for its other CPUs). A 256-expert MoE's prompt gives its experts ~16 tokens
// each (512 x top-8 / 256), so they now take the GEMM.
// Then Zen 4 (avx512, BENCHMARKS.md round (10): --nt 9,10,12,14 --n 2048,4096,14336 --mb 16 --cpu 1
// --stat min, windows / gemm): Q4_K 1.16-1.17, 1.20-1.28, 1.42-1.44, 1.64-1.82; Q5_K 1.26-1.28,
// 1.34-1.38, 1.46-1.50, 1.74-1.79; Q6_K 1.04-1.09, 1.12-1.21, 1.23-1.32, 1.46-1.56; and Zen 5's
// round (9) Q4_K / Q5_K 1.07-1.19 at 9, Q6_K 1.08 at 12. So at avx512 every window above 8 tokens
// takes the GEMM for Q4_K and Q5_K, and from 12 for Q6_K (the margin: 1.04 at 9 on Zen 4).
// At avx2 (Zen 3, BENCHMARKS.md "avx2 GEMM tier (Zen 3)": bench kernels --n 4096 --mb 64 --clock
// cpu --stat min, windows / gemm at 16, 32, 64, 256 tokens): Q4_K 1.03, 1.17, 1.33, 1.29 (its
// int16 sums: 4 dwords per vpmaddwd); Q5_K 0.88, 1.02, 1.04, 1.32 and Q6_K 0.78, 0.95, 1.00,
// 1.27 (2 dwords: vdot's vpmaddwd each): Q4_K from 32, Q5_K from 64, Q6_K from 128 tokens.
#if defined(__AVX512F__)
constexpr int kQ4kR8GemmMinNt = 24;
#else
// avx2: from 32 as Q4_K's. Zen 3 (`bench kernels --formats Q4_K_R8 --nt 16,24,32,48,64,128,512
// --n 4096 --mb 16 --cpu 1 --clock cpu --stat min`, windows / gemm): 0.60, 0.93, 1.03, 0.97, 0.93,
// 1.05, 1.09 with the rows in L3; from DRAM (a real 8B's FFN matrices, 33 MB) each window of 8
// re-reads them, which the GEMM does once a chunk: so not above 32. After the passes of 2 vectors
// (MAXR_KQ; BENCHMARKS.md round (22)): 1.01-1.08 at 16, 0.91-0.93 at 20, 1.03-1.05 at 24, 1.14-1.18
// at 32 (n = 4096 and 768, --mb 8), and the Qwen3-30B-A3B-shaped slice's prefill (its experts from
// DRAM, ~32 tokens each; tools/bench_prefill.py, LOWBIT_KQ_GEMM_MIN_NT alternated three times)
// 181-219 tok/s at 32, 197-203 at 16, 218-247 at 24: from 24.
constexpr int kQ4kR8GemmMinNt = 24;
#endif
#if defined(__AVX512F__)
constexpr int kKqGemmMinNt = 9, kQ5kGemmMinNt = 9, kQ6kGemmMinNt = 12;
#elif defined(__AVXVNNI__)
constexpr int kKqGemmMinNt = 16, kQ5kGemmMinNt = 16, kQ6kGemmMinNt = 24;
#else
// avx2 after its passes of 2 lane vectors (MAXR_KQ; Zen 3, BENCHMARKS.md round (22): bench kernels
// --formats Q4_K,Q5_K,Q3_K,Q2_K --nt 12,16,20,24,32 --n 4096 and 768 --mb 8 --cpu 1 --clock cpu
// --stat min, windows / gemm): Q4_K 1.02-1.23, 1.39-1.44, 1.15-1.20, 1.42-1.47, 1.50-1.55; Q5_K
// 1.05-1.11, 1.31-1.37, 1.17-1.42, 1.44-1.48, 1.48-1.54: both from 16 (Q6_K keeps vdot and its
// passes of one vector: 128)
constexpr int kKqGemmMinNt = 16, kQ5kGemmMinNt = 16, kQ6kGemmMinNt = 128;
#endif
// Q2_K, Q3_K and IQ4_XS (GQ2K, GQ3K, GIQ4XS; LOWBIT_KQ_GEMM_MIN_NT sets them with Q4_K's): their windows
// decode each super-block per window (0.062-0.088 us per row and token at 8..64 tokens, n = 4096,
// against Q4_K's 0.046-0.061). Zen 4, `bench kernels --formats Q3_K,IQ4_XS --nt 9,12,16,24,32,64,512
// --n 4096 --mb 16 --cpu 1 --clock cpu --stat min`, windows / gemm: Q3_K 1.05, 1.33, 1.69, 1.65,
// 2.39, 2.41, 1.94; IQ4_XS 1.06, 1.26, 1.60, 1.60, 1.81, 2.46, 3.02: from 9 as Q4_K. At avx2 (the
// same CPU under LOWBIT_MAX_ISA=avx2) Q3_K 1.08, 1.53, 2.22 at 16, 32, 64: from 32 as Q4_K; at
// avx2vnni (no such host measured) 16 as Q4_K.
// Q2_K (GQ2K, mins per 16 codes) the same way: 0.93, 1.09, 1.36, 1.91, 1.96, 2.46 at 9, 12, 16,
// 32, 64, 512: from 12 (as Q6_K; at avx2vnni 24 as Q6_K's); at avx2 1.08, 1.31, 1.18 at 16, 32, 64:
// from 32.
#if defined(__AVX512F__)
constexpr int kQ3kGemmMinNt = 9, kIq4xsGemmMinNt = 9, kQ2kGemmMinNt = 12;
#elif defined(__AVXVNNI__)
constexpr int kQ3kGemmMinNt = 16, kIq4xsGemmMinNt = 16, kQ2kGemmMinNt = 24;
#else
// (avx2 since its passes of 2 vectors, as Q4_K above: Q3_K 1.23-1.24, 1.46-1.48, 1.08-1.36,
// 1.17-1.42, 1.58-1.66; Q2_K 1.00-1.05, 1.12-1.16, 1.00-1.17, 1.12-1.28, 1.22-1.38: from 16)
constexpr int kQ3kGemmMinNt = 16, kQ2kGemmMinNt = 16;
#endif
// The grid i-quants, IQ1_S / IQ1_M and TQ2_0 / TQ1_0 (GIQ3XXS ... GTQ1; LOWBIT_KQ_GEMM_MIN_NT sets
// them with Q4_K's). Zen 4, `bench kernels --formats ... --nt 9,12,16,24,32,64,512 --n 4096 --mb 16
// --cpu 1 --clock cpu --stat min --reps 5`, windows / gemm (one run, noisy: 2 shared cores):
//   avx512  IQ3_XXS 1.31, 1.22, 1.20, 1.73, 1.95, 2.60, 3.54;  IQ3_S 1.01, 1.09, 1.33, 1.48, 1.81, 2.68, 3.52;
//           IQ2_XXS 1.08, 1.21, 1.52, 1.53, 2.04, 2.94, 3.03;  IQ2_XS 0.85, 0.92, 1.20, 1.10, 1.82, 2.08, 2.60;
//           IQ2_S 0.98, 1.11, 1.56, 1.48, 2.69, 2.36, 2.96;    IQ1_S 1.04, 1.06, 1.46, 1.40, 2.14, 2.42, 3.16;
//           IQ1_M 0.78, 0.99, 1.17, 1.43, 1.74, 2.20, 3.09;    TQ2_0 0.85, 1.10, 1.48, 1.32, 1.71, 1.81, 2.09;
//           TQ1_0 0.80, 0.91, 1.07, 1.25, 1.66, 1.99, 2.38;
//   avx2 (LOWBIT_MAX_ISA=avx2, LOWBIT_KQ_GEMM_MIN_NT=9; at 16, 32, 64, 512): IQ3_XXS 1.16, 1.47, 1.58, 1.87;
//           IQ3_S 1.33, 1.72, 1.82, 2.43; IQ2_XXS 1.12, 1.38, 1.38, 1.73; IQ2_XS 1.02, 1.30, 1.52, 1.53;
//           IQ2_S 1.01, 1.54, 1.56, 1.82; IQ1_S 1.49, 1.68, 2.14, 2.40; IQ1_M 1.09, 1.41, 1.63, 1.92;
//           TQ2_0 0.88, 0.82, 1.19, 1.20; TQ1_0 0.72, 1.16, 1.32, 1.52.
// So each from its first clear win (>= ~1.15; IQ3_XXS from 9 as IQ4_XS); at avx2vnni (no such host
// here) 16 where avx512's is 9, 32 for TQ1_0, else 24 (as Q2_K / Q6_K against their avx512 gates).
#if defined(__AVX512F__)
constexpr int kIq3xxsGemmMinNt = 9, kIq3sGemmMinNt = 16, kIq2xxsGemmMinNt = 12, kIq2xsGemmMinNt = 16, kIq2sGemmMinNt = 16,
              kIq1sGemmMinNt = 16, kIq1mGemmMinNt = 16, kTq2GemmMinNt = 16, kTq1GemmMinNt = 24;
#elif defined(__AVXVNNI__)
constexpr int kIq3xxsGemmMinNt = 16, kIq3sGemmMinNt = 24, kIq2xxsGemmMinNt = 24, kIq2xsGemmMinNt = 24, kIq2sGemmMinNt = 24,
              kIq1sGemmMinNt = 24, kIq1mGemmMinNt = 24, kTq2GemmMinNt = 24, kTq1GemmMinNt = 32;
#else
constexpr int kIq3xxsGemmMinNt = 32, kIq3sGemmMinNt = 16, kIq2xxsGemmMinNt = 32, kIq2xsGemmMinNt = 32, kIq2sGemmMinNt = 32,
              kIq1sGemmMinNt = 16, kIq1mGemmMinNt = 32, kTq2GemmMinNt = 64, kTq1GemmMinNt = 64;
#endif
// The same for Q4_0, Q4_1, Q8_0 (LOWBIT_LEGACY_GEMM_MIN_NT). Measured on Zen 4 with 32 KB
// window tiles: 1.7-2.4x at 16 tokens; on Zen 5 with the 512 KB tiles of csrc/matmul.cpp, whose
// windows no longer re-lay out their activations every 20 rows: 0.74-1.73x at 16 tokens with
// the rows in L3 (n = 4096), 0.67-0.79x with them in DRAM (n = 512..2048), and 1.0-1.7x at 32
// in both; so 32 (at avx2vnni: a server step of 16 decode tokens runs as two windows).
// At avx2 (Zen 3, as above): Q4_0 0.83, 1.00, 1.14, 1.19; Q4_1 0.82, 0.96, 1.08, 1.01: from 64;
// Q8_0 (the sign trick, BENCHMARKS.md "Q8_0 GEMM at avx2 (Zen 3)") 0.86-0.87, 0.99-1.00,
// 1.02-1.06, 1.11-1.14 in two runs: from 64 too.
// At avx512 the windows include the 16-token wide window (csrc/x86/legacy.inl); against it
// (Zen 5, BENCHMARKS.md round (8): 1 MB of rows, one thread, GEMM / windows at 32, 48, 64
// tokens, Q4_0 / Q4_1 / Q8_0) the GEMM is 0.91-0.98, 0.89-0.93, 0.80-0.83 at n = 576, 1.02-1.19,
// 0.95-1.08, 0.88-0.99 at 1536 and 2048, 0.81-1.06, 0.75-1.03, 0.76-0.92 at 4096 and 14336:
// the wide window wins at 32-47 tokens only for the middle widths, so 32 here too.
#if defined(__AVX512F__) || defined(__AVXVNNI__)
constexpr int kLegacyGemmMinNt = 32;
#else
constexpr int kLegacyGemmMinNt = 64;
#endif
// Q5_0 / Q5_1 at avx2 (Zen 3, `lowbit bench kernels --formats Q5_0,Q5_1 --nt 16,32,64,128,256
// --n 4096 --mb 64 --clock cpu --stat min`, windows / gemm per nt): quiet, Q5_0 0.84, 0.99, 0.95,
// 1.34, 1.40 and Q5_1 0.79, 0.93, 0.97, 1.16, 1.16 (loaded, at 16..128: Q5_0 0.75, 0.99, 1.22,
// 1.35, Q5_1 0.70, 0.99, 0.89, 1.05): both from 128 (Q5_1's codes reach 31: vdot, not the int16
// presums). With VNNI (not measured: no such host here) the other legacy formats' 32.
// Q5_1 at avx2 since its codes go unsigned (kUnsignedCodes: int16 sums of 4 dwords), Zen 3, one
// thread, builds interleaved in one process (medians, windows / gemm): n = 1408 (GLM-4.5's and
// DeepSeek-V2's expert down rows) 1.11 at 16, 1.26 at 32, 1.39 at 48, 1.51 at 64, 1.54 at 128;
// n = 4096 1.01 at 16, 1.19 at 24, 1.26 at 32: from 24.
#if defined(__AVX512F__) || defined(__AVXVNNI__)
constexpr int kQ5GemmMinNt = kLegacyGemmMinNt;
constexpr int kQ5_1GemmMinNt = kLegacyGemmMinNt;
#else
constexpr int kQ5GemmMinNt = 128;
constexpr int kQ5_1GemmMinNt = 24;
#endif
// The same for I2_S (LOWBIT_I2S_GEMM_MIN_NT). avx2 (its int16 sums, passes of 2 vectors; Zen 3,
// the BitNet b1.58 2B-4T-shaped slice's 512-token prefill, tools/bench_prefill.py, the GEMM off /
// from 16 alternated three times: 62.8 / 75.6, 67.9 / 71.3, 67.7 / 83.3 tok/s) 16 as avx512.
constexpr int kI2sLanesGemmMinNt = 16;
// The legacy R8 layouts' GEMM gate. avx512 256: their windows beat it below (Zen 4, `bench kernels
// --formats Q4_1_R8,Q8_0_R8,Q4_0_R8 --mb 1.5 --nt 64,128,256,512`, windows / gemm at n = 768, 1536
// and 4096: 0.74-0.98 at 64, 0.88-1.13 at 128, 0.94-1.15 at 256, 0.95-1.24 at 512). avx2 (and
// avx2vnni, which runs avx2's R8 windows) 32 (Zen 3, `bench kernels --formats Q4_1_R8,Q4_0_R8 --nt
// 32,64,128,256,512 --mb 1.5 --cpu 1 --clock cpu --stat min`, windows / gemm at n = 1536 and 4096:
// 1.03-1.44 at 32, 1.02-1.17 at 64 (one 0.75), 1.24-1.72 at 128; at 16 the windows win, 0.78-0.81).
#if defined(__AVX512F__)
constexpr int kLegacyR8GemmMinNt = 256;
#else
constexpr int kLegacyR8GemmMinNt = 32;
#endif
// The longest tail of a chunk (its tokens past the last whole lane vector) that the windows take
// instead of a padded GEMM pass (KernelEntry::gemm_tail; LOWBIT_GEMM_TAIL). Zen 4, one thread,
// `bench kernels --nt ... --n 2560 --mb 16 --cpu 1 --stat min`, tail 4 against 0 (BENCHMARKS.md,
// round (10)): avx512 at 17, 18, 20 tokens Q4_K 1.40, 1.25, 1.15x and I2_S 1.5, 1.45, 1.32x; at
// 33 and 36 Q4_1, Q8_0, Q6_K 1.25-1.3x and 1.1-1.18x; tails of 6 about even, 8 lost (Q4_K
// 0.88x at 24); avx2 (8 lanes) Q4_K at 33..36 1.11, 1.09, 1.06, 1.05x.
constexpr int kGemmTail = 4;

}  // namespace

// The amx level's crossovers against avx512's GEMM (KernelEntry::gemm_cross: chunks of fewer
// GEMM tokens keep avx512's GEMM, bitwise the same). Sapphire Rapids-class Xeon, BENCHMARKS.md
// round 24: `bench kernels --nt 12,16,24,32[,48,64,128,256] --n 2048 --mb 4-8 --cpu 1 --clock cpu
// --stat min`, avx512 GEMM / amx GEMM: Q4_K 0.88, 0.92, 1.16, 1.14 at 12-32 and Q5_K 0.93, 0.93,
// 1.19, 1.04: from 24; Q2_K 1.24-1.69 everywhere: none. The 16-sub-block tile GEMM (mk_amx:
// IQ4_XS, TQ2_0, TQ1_0, IQ3_XXS, IQ3_S, IQ2_XXS, IQ1_S) 0.88-0.97 at 12-16, 0.96-1.04 at 24-48,
// 1.02-1.10 at 64, 1.06-1.14 at 128: from 64. The legacy formats' (mk_amx_legacy) at 32, 64, 128,
// 256: Q4_0 0.90, 0.93, 0.96, 1.05 and Q5_0 0.89, 0.93, 1.00, 1.03: from 256; Q4_1 0.94, 1.01,
// 1.09, 1.10 and Q8_0 0.99, 0.96, 1.02, 1.05: from 128; Q5_1 0.93, 1.05, 1.03, 1.09: from 64.
// Their R8 layouts' GEMM starts at 256 tokens anyway. The R8 layouts of the k-family at 24, 32,
// 48, 64: Q4_K_R8 1.03, 1.02, 1.08, 1.23 (none: its gate, 24); Q5_K_R8 0.97, 0.99, 1.08, 1.14: from
// 48; IQ4_XS_R8 0.91 (windows), 0.95, 0.99, 1.06: from 64. LOWBIT_AMX_CROSS=0: none (the tiles
// from the gates). A crossover at or below a format's gate changes nothing.
// (The emulated level has none: it exists to run the tile microkernels in tests, at every width.)
constexpr int amx_cross(int id) {
#if defined(LOWBIT_AMX) && !defined(LOWBIT_AMX_EMULATE)
    if (id == T_Q4_K || id == T_Q5_K) return 24;
    if (id == kQ5kR8Id) return 48;
    if (id == kIq4xsR8Id) return 64;
    if (id == T_IQ4_XS || id == T_TQ2_0 || id == T_TQ1_0 || id == T_IQ3_XXS || id == T_IQ3_S || id == T_IQ2_XXS ||
        id == T_IQ1_S)
        return 64;
    if (id == T_Q4_0 || id == T_Q5_0) return 256;
    if (id == T_Q4_1 || id == T_Q8_0) return 128;
    if (id == T_Q5_1) return 64;
#endif
    (void)id;
    return 0;
}

void register_gemm(KernelTable &t) {
    const char *g = std::getenv("LOWBIT_KQ_GEMM_MIN_NT");
    const int min_nt = g && *g ? std::atoi(g) : kKqGemmMinNt;
    const char *gt = std::getenv("LOWBIT_GEMM_TAIL");
    const int tail = gt && *gt ? std::atoi(gt) : kGemmTail;
    const char *xc = std::getenv("LOWBIT_AMX_CROSS");
    const bool cross = !(xc && std::strcmp(xc, "0") == 0);
    auto set = [&](int id, rows_fn fn, const char *name, int gate) {
        auto &e = t.at(id);
        e.gemm = RowKernel{fn, name, LOWBIT_ISA};
        e.gemm_min_nt = gate;
        e.gemm_lanes = LANES, e.gemm_tail = tail, e.gemm_rows = kGemmRows;
        e.gemm_cross = cross ? amx_cross(id) : 0;
    };
    const auto gate = [&](int own) { return g && *g ? min_nt : own; };  // LOWBIT_KQ_GEMM_MIN_NT, else own
    set(T_Q4_K, &gemm_kq<GQ4K, 144>, "gemm_q4_k_q8_k_" LB_GK_LEVEL, min_nt);
    // Q4_K's R8 layout (its windows: register_kq_r8, 1.4-2.0x the row-major windows): its GEMM
    // from kQ4kR8GemmMinNt tokens (avx512 24: Zen 4, `bench kernels --formats Q4_K_R8 --stat min
    // --cpu 1`, windows / gemm: n = 2048 1.11, 0.96, 1.28 at 16, 24, 32; n = 4096 0.95, 1.04, 1.35;
    // avx2 32, at the constant); LOWBIT_KQ_GEMM_MIN_NT sets it with Q4_K's
    set(kQ4kR8Id, &gemm_kq<GQ4K_R8, 144>, "gemm_q4_k_r8_q8_k_" LB_GK_LEVEL, gate(kQ4kR8GemmMinNt));
#if defined(__AVX512F__)
    // Q5_K's R8 layout: its GEMM from 24 tokens too (Zen 4, `bench kernels --formats Q5_K_R8 --nt
    // 16,20,24,28,32 --mb 1.5`, windows / gemm at n = 2048 and 4096, noisy: 0.77-0.78 at 20,
    // 0.91-1.53 at 24, 1.00-1.24 at 32; Q5_K's own gate is 9: its windows are 1.3-1.8x slower)
    set(kQ5kR8Id, &gemm_kq<GQ5K_R8, 176>, "gemm_q5_k_r8_q8_k_" LB_GK_LEVEL, gate(24));
#endif
    set(T_Q5_K, &gemm_kq<GQ5K, 176>, "gemm_q5_k_q8_k_" LB_GK_LEVEL,
        gate(kQ5kGemmMinNt));
    if (amx_takes<GQ6K>())
        set(T_Q6_K, &gemm_kq<GQ6K, 210>, "gemm_q6_k_q8_k_" LB_GK_LEVEL, gate(kQ6kGemmMinNt));
    set(T_Q2_K, &gemm_kq<GQ2K, 84>, "gemm_q2_k_q8_k_" LB_GK_LEVEL, gate(kQ2kGemmMinNt));
    if (amx_takes<GQ3K>()) set(T_Q3_K, &gemm_kq<GQ3K, 110>, "gemm_q3_k_q8_k_" LB_GK_LEVEL, gate(kQ3kGemmMinNt));
#if defined(__AVX512F__) || defined(__AVXVNNI__)
    // (IQ4_XS's codes need vdot's full signed byte: at avx2 its windows only)
    set(T_IQ4_XS, &gemm_kq<GIQ4XS, 136>, "gemm_iq4_xs_q8_k_" LB_GK_LEVEL, gate(kIq4xsGemmMinNt));
#elif defined(LOWBIT_AMX)
    // (the emulated amx level over avx2: the tiles take any byte; Q4_K's gate)
    set(T_IQ4_XS, &gemm_kq<GIQ4XS, 136>, "gemm_iq4_xs_q8_k_" LB_GK_LEVEL, gate(kKqGemmMinNt));
#endif
#if defined(__AVX512F__)
    // IQ4_XS's R8 layout (whole groups put back together by transposes, then GIQ4XS's decode:
    // decode_tile): its GEMM from 28 tokens, its windows being 2x IQ4_XS's (Zen 4, `bench kernels
    // --formats IQ4_XS_R8 --n 4096 --mb 2 --cpu 1 --clock cpu --stat min`, windows / gemm: 0.91-0.93
    // at 16, 0.75 at 20, 0.78-0.91 at 24, 1.06 at 28, 1.16-1.21 at 32, 1.36 at 48, 1.42 at 64; the
    // R8 GEMM takes 0.99-1.11x IQ4_XS's GEMM's time at 32..128 tokens). LOWBIT_KQ_GEMM_MIN_NT sets
    // it with the k-quants'
    set(kIq4xsR8Id, &gemm_kq<GIQ4XS_R8, 136>, "gemm_iq4_xs_r8_q8_k_" LB_GK_LEVEL, gate(28));
#endif
    // the grid i-quants, IQ1_* and the ternary formats (codes |w| <= 62: every level's vdot)
    set(T_IQ3_XXS, &gemm_kq<GIQ3XXS, 98>, "gemm_iq3_xxs_q8_k_" LB_GK_LEVEL, gate(kIq3xxsGemmMinNt));
    set(T_IQ3_S, &gemm_kq<GIQ3S, 110>, "gemm_iq3_s_q8_k_" LB_GK_LEVEL, gate(kIq3sGemmMinNt));
    set(T_IQ2_XXS, &gemm_kq<GIQ2XXS, 66>, "gemm_iq2_xxs_q8_k_" LB_GK_LEVEL, gate(kIq2xxsGemmMinNt));
    if (amx_takes<GIQ2XS>()) set(T_IQ2_XS, &gemm_kq<GIQ2XS, 74>, "gemm_iq2_xs_q8_k_" LB_GK_LEVEL, gate(kIq2xsGemmMinNt));
    if (amx_takes<GIQ2S>()) set(T_IQ2_S, &gemm_kq<GIQ2S, 82>, "gemm_iq2_s_q8_k_" LB_GK_LEVEL, gate(kIq2sGemmMinNt));
    set(T_IQ1_S, &gemm_kq<GIQ1S, 50>, "gemm_iq1_s_q8_k_" LB_GK_LEVEL, gate(kIq1sGemmMinNt));
    if (amx_takes<GIQ1M>()) set(T_IQ1_M, &gemm_kq<GIQ1M, 56>, "gemm_iq1_m_q8_k_" LB_GK_LEVEL, gate(kIq1mGemmMinNt));
    set(T_TQ2_0, &gemm_kq<GTQ2, 66>, "gemm_tq2_0_q8_k_" LB_GK_LEVEL, gate(kTq2GemmMinNt));
    set(T_TQ1_0, &gemm_kq<GTQ1, 54>, "gemm_tq1_0_q8_k_" LB_GK_LEVEL, gate(kTq1GemmMinNt));
    const char *gl = std::getenv("LOWBIT_LEGACY_GEMM_MIN_NT");
    const int min_legacy = gl && *gl ? std::atoi(gl) : kLegacyGemmMinNt;
    set(T_Q4_0, &gemm_legacy<GQ4_0>, "gemm_q4_0_q8_0_" LB_GK_LEVEL, min_legacy);
    set(T_Q4_1, &gemm_legacy<GQ4_1>, "gemm_q4_1_q8_1_" LB_GK_LEVEL, min_legacy);
#if !defined(LOWBIT_AMX) || !defined(LB_GK_SIGN)  // (the emulated amx level: avx2's, by the sign trick)
    set(T_Q8_0, &gemm_legacy<GQ8_0>, "gemm_q8_0_q8_0_" LB_GK_LEVEL, min_legacy);  // avx2: vdot_sign
#endif
    // The legacy R8 layouts' GEMM (their windows: csrc/x86/{avx2,avx512}/lg_r8.cpp) from
    // kLegacyR8GemmMinNt tokens: their windows beat it below. LOWBIT_LEGACY_GEMM_MIN_NT sets it with
    // the legacy formats'.
    const int min_r8 = gl && *gl ? min_legacy : kLegacyR8GemmMinNt;
    set(kQ4_0R8Id, &gemm_legacy<GR8Rows<GQ4_0>>, "gemm_q4_0_r8_q8_0_" LB_GK_LEVEL, min_r8);
    set(kQ4_1R8Id, &gemm_legacy<GR8Rows<GQ4_1>>, "gemm_q4_1_r8_q8_1_" LB_GK_LEVEL, min_r8);
#if defined(__AVX512F__)
    set(kQ8_0R8Id, &gemm_legacy<GR8Rows<GQ8_0>>, "gemm_q8_0_r8_q8_0_" LB_GK_LEVEL, min_r8);  // (avx512 only)
#endif
    // Q5_0 / Q5_1: llama-quant's fallback where 256 does not divide a row (Q4_K -> Q5_0, Q5_K ->
    // Q5_1: the experts' down matrices of GLM-4.5 and DeepSeek-V2 at width 1408)
    set(T_Q5_0, &gemm_legacy<GQ5_0>, "gemm_q5_0_q8_0_" LB_GK_LEVEL, gl && *gl ? min_legacy : kQ5GemmMinNt);
    set(T_Q5_1, &gemm_legacy<GQ5_1>, "gemm_q5_1_q8_1_" LB_GK_LEVEL, gl && *gl ? min_legacy : kQ5_1GemmMinNt);
#if defined(__AVX512F__) || defined(LOWBIT_AMX) || defined(LB_GK_KQ_V2)
    // I2_S: this GEMM replaces the level's tile-decode GEMM of csrc/x86/ternary.inl (registered
    // before it), under the same switch LOWBIT_I2S_GEMM_MIN_NT
    // (avx2: not under LOWBIT_I2S_FOLD=1, whose A/B runs take ternary.inl's GEMM with its windows'
    // fold schedule; this one folds its int16 sums every K_I2S dwords whatever the variable)
    const char *gi = std::getenv("LOWBIT_I2S_GEMM_MIN_NT");
#if defined(LB_GK_KQ_V2)
    const char *fold = std::getenv("LOWBIT_I2S_FOLD");
    if (!(fold && *fold && std::strcmp(fold, "0") != 0))
#endif
    {
        auto &ei = t.at(T_I2_S);
        ei.gemm = RowKernel{&gemm_i2s, "gemm_i2_s_i8_s_" LB_GK_LEVEL, LOWBIT_ISA};
        ei.gemm_min_nt = gi && *gi ? std::atoi(gi) : kI2sLanesGemmMinNt;
        ei.gemm_lanes = LANES, ei.gemm_tail = tail, ei.gemm_rows = kGemmRows;
    }
#else
    (void)&gemm_i2s;
#endif
}

#undef LB_GK_STR
#undef LB_GK_LEVEL
#undef LB_GK_TABLE
#undef LB_GK_TABLE_KQ
#undef LB_GK_KQ_V2
#undef LB_GK_STR2
#undef LB_GK_INLINE

}  // namespace LOWBIT_NS
}  // namespace lowbit

#pragma GCC diagnostic pop
