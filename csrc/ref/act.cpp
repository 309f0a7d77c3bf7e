// Activation quantizers Q8_0, Q8_1, Q8_K: byte-identical to the from_float that ggml's CPU
// backend really runs (invariant I4), for every input, including zeros, exact ties, ±inf,
// NaN, denormals and values near FLT_MAX.
//
// Which ggml code that is (llama-cpp-python's libggml-cpu, built for x86 with AVX2/AVX-512):
//   Q8_0, Q8_1  the AVX2 path of quantize_row_q8_0 / quantize_row_q8_1 in
//               ggml-cpu/arch/x86/quants.c (NOT quantize_row_q8_*_ref, which rounds half
//               away from zero and scales by 1/d instead of 127/amax);
//   Q8_K        quantize_row_q8_K_ref in ggml-quants.c (x86 has no SIMD version).
// The SIMD instructions' semantics are emulated here in plain scalar C++; see the helpers.
//
// The block fp16 scales go through ggml's software fp32->fp16 (ggml_compute_fp32_to_fp16;
// the wheel's quantize_row_q8_0/_1 disassemble to it, not to vcvtps2ph): round to nearest
// even like F16C, except that every NaN becomes the canonical 0x7e00 (with its sign) where
// F16C would keep the top payload bits. (Checked equal for all 2^32 inputs.)
//
// Known deviation, on purpose: for an all-zero (or all-NaN) Q8_K block ggml writes d = 0 and
// qs = 0 but leaves bsums untouched (whatever the buffer held); we write bsums = 0. With a
// zero-filled destination the bytes agree.
#include "ref.h"

namespace lowbit::ref {
namespace {

// ---- emulated instructions ----------------------------------------------------------------

// maxps / maxss: a > b ? a : b. If either is NaN the comparison is false and the SECOND
// operand is returned, so which NaNs survive depends on the operand order of ggml's tree.
float maxps(float a, float b) { return a > b ? a : b; }

// roundps with imm 0 (_MM_ROUND_NEAREST): round half to even, whatever MXCSR says, then
// cvtps2dq: a NaN, ±inf or anything outside [-2^31, 2^31) becomes 0x80000000 (INT32_MIN).
int32_t round_even_cvt(float v) {
    if (!(std::fabs(v) < 2147483648.0f)) return INT32_MIN;  // also NaN; -2^31 is INT32_MIN anyway
    if (std::fabs(v) >= 8388608.0f) return (int32_t)v;      // >= 2^23: already an integer
    const float t = std::trunc(v);                           // exact
    const float r = v - t;                                   // exact, in (-1, 1)
    int32_t i = (int32_t)t;
    if (r > 0.5f || (r == 0.5f && (i & 1))) ++i;
    if (r < -0.5f || (r == -0.5f && (i & 1))) --i;
    return i;
}

// packssdw then packsswb: int32 -> int16 -> int8, each saturating; together a clamp.
int8_t sat_i8(int32_t i) { return (int8_t)(i < -128 ? -128 : i > 127 ? 127 : i); }

// ggml's software fp32 -> fp16 (see the file comment): RNE, NaN -> sign | 0x7e00.
uint16_t ggml_fp16(float f) {
    if (std::isnan(f)) return (uint16_t)(((f32_to_bits(f) >> 16) & 0x8000u) | 0x7e00u);
    return f32_to_fp16(f);
}

// max |x| of a 32-value block, as ggml's AVX2 reduction computes it: |x| by clearing the
// sign bit; lane l (0..7) of the four 8-float vectors x[0..7], x[8..15], x[16..23],
// x[24..31] is folded left to right with maxps(acc, next); then the high 128-bit half
// against the low (maxps(hi, lo)), lanes 2,3 into 0,1 (maxps(v, movehl)), lane 1 into 0
// (maxss(v, movehdup)).
float block_amax_avx2(const float *x) {
    float lane[8];
    for (int l = 0; l < 8; ++l) {
        float m = std::fabs(x[l]);
        m = maxps(m, std::fabs(x[8 + l]));
        m = maxps(m, std::fabs(x[16 + l]));
        m = maxps(m, std::fabs(x[24 + l]));
        lane[l] = m;
    }
    float h[4];
    for (int l = 0; l < 4; ++l) h[l] = maxps(lane[4 + l], lane[l]);
    const float g0 = maxps(h[0], h[2]);
    const float g1 = maxps(h[1], h[3]);
    return maxps(g0, g1);
}

// ---- Q8_0 / Q8_1 (ggml's AVX2 quantize_row_q8_0 / _1) ------------------------------------
//
// Per block: amax as above; d = amax / 127; id = amax != 0 ? 127 / amax : 0 (a NaN amax
// compares unequal, so id is NaN); q = sat8(cvt(round_even(x * id))). Consequences kept
// on purpose: a NaN x gives -128; an infinite amax gives id = 0, so inf * 0 = NaN -> -128
// for the infinities and 0 elsewhere; an amax below 127 / FLT_MAX (~3.7e-37: denormals and
// the smallest normals) gives id = inf, so every x * id is ±inf or NaN and every q is -128.
// Q8_1's s = fp16(d * (float)sum) with sum the int32 (wrapping) sum of the cvt results
// BEFORE saturation.

void quant_act_q8_0(const float *x, uint8_t *dst, int64_t n) {
    block_q8_0 *y = reinterpret_cast<block_q8_0 *>(dst);
    for (int64_t b = 0; b < n / QK; ++b) {
        const float *xb = x + b * QK;
        const float amax = block_amax_avx2(xb);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const uint16_t dh = ggml_fp16(d);
        std::memcpy(&y[b].d, &dh, 2);
        for (int j = 0; j < QK; ++j) y[b].qs[j] = sat_i8(round_even_cvt(xb[j] * id));
    }
}

void quant_act_q8_1(const float *x, uint8_t *dst, int64_t n) {
    block_q8_1 *y = reinterpret_cast<block_q8_1 *>(dst);
    for (int64_t b = 0; b < n / QK; ++b) {
        const float *xb = x + b * QK;
        const float amax = block_amax_avx2(xb);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        uint32_t sum = 0;  // two's complement wrap, as paddd
        for (int j = 0; j < QK; ++j) {
            const int32_t i = round_even_cvt(xb[j] * id);
            sum += (uint32_t)i;
            y[b].qs[j] = sat_i8(i);
        }
        const uint16_t dh = ggml_fp16(d);
        const uint16_t sh = ggml_fp16(d * (float)(int32_t)sum);
        std::memcpy(&y[b].d, &dh, 2);
        std::memcpy(&y[b].s, &sh, 2);
    }
}

// ---- Q8_K (ggml's quantize_row_q8_K_ref) -----------------------------------------------
//
// Per 256-value block: max = the first x with the largest |x| (strictly greater replaces;
// NaN never does). amax == 0 (all zeros and NaNs): d = 0, q = 0. Otherwise
// iscale = -127 / max, q = min(127, nearest_int(iscale * x)) stored as its low byte,
// d = 1 / iscale, bsums[j] = sum of q[16j .. 16j+15]. nearest_int is ggml's 1.5*2^23 bit
// trick, applied to any input: a NaN product gives its payload's low 22 bits (then
// min 127; the default NaN of inf * 0 gives 0), an infinite one gives -2^22, whose low
// byte is 0. So max = ±inf makes iscale = ∓0, d = ∓inf and q = 0; a max below
// 127 / FLT_MAX (denormals, the smallest normals) makes iscale = ∓inf, d = ∓0 and q = 0.

void quant_act_q8_K(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const float *xb = x + b * QK_K;
        uint8_t *yb = dst + b * sizeof(block_q8_K);
        block_q8_K blk;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K; ++j) {
            const float ax = std::fabs(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (amax == 0.0f) {
            std::memset(&blk, 0, sizeof(blk));
        } else {
            const float iscale = -127.0f / max;
            for (int j = 0; j < QK_K; ++j) {
                const int v = nearest_int(iscale * xb[j]);
                blk.qs[j] = (int8_t)(uint8_t)(v < 127 ? v : 127);
            }
            for (int j = 0; j < QK_K / 16; ++j) {
                int sum = 0;
                for (int l = 0; l < 16; ++l) sum += blk.qs[16 * j + l];
                blk.bsums[j] = (int16_t)sum;
            }
            blk.d = 1.0f / iscale;
        }
        std::memcpy(yb, &blk, sizeof(blk));
    }
}

// ---- dequantization of the activation formats (d * q) -------------------------------------
// Q8_0's is the weight dequantizer registered by register_legacy (same bytes, same meaning).

void dequant_q8_1(const uint8_t *src, float *dst, int64_t n, float) {
    const block_q8_1 *x = reinterpret_cast<const block_q8_1 *>(src);
    for (int64_t b = 0; b < n / QK; ++b) {
        const float d = fp16_to_f32(x[b].d);
        for (int j = 0; j < QK; ++j) dst[b * QK + j] = d * (float)x[b].qs[j];
    }
}

void dequant_q8_K(const uint8_t *src, float *dst, int64_t n, float) {
    const block_q8_K *x = reinterpret_cast<const block_q8_K *>(src);
    for (int64_t b = 0; b < n / QK_K; ++b)
        for (int j = 0; j < QK_K; ++j) dst[b * QK_K + j] = x[b].d * (float)x[b].qs[j];
}

}  // namespace

void register_act(KernelTable &t) {
    t.set_quant_act(T_Q8_0, quant_act_q8_0, "quant_act_q8_0_scalar", ISA_SCALAR);
    t.set_quant_act(T_Q8_1, quant_act_q8_1, "quant_act_q8_1_scalar", ISA_SCALAR);
    t.set_quant_act(T_Q8_K, quant_act_q8_K, "quant_act_q8_k_scalar", ISA_SCALAR);
    t.at(T_Q8_1).dequant = dequant_q8_1;
    t.at(T_Q8_K).dequant = dequant_q8_K;
}

}  // namespace lowbit::ref
