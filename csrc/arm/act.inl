// Activation quantizers at the aarch64 levels: Q8_0, Q8_1, Q8_K, I8_S, byte-identical to the
// scalar reference (csrc/ref/act.cpp, csrc/ref/ternary.cpp) for every input (I4): zeros, ties,
// denormals, +-inf, NaN. Shared body of csrc/arm/<level>/act.cpp.
//
// The reference emulates the x86 instructions ggml's quantizers run (csrc/ref/act.cpp); NEON's
// own instructions differ at the edges, so each is pinned down here:
//   maxps(a, b) = a > b ? a : b (the second operand on NaN): vbslq(vcgtq(a, b), a, b),
//     never vmaxq (which returns NaN) nor vmaxnmq (which drops it);
//   roundps + cvtps2dq: vcvtnq_s32_f32 rounds half to even like roundps, but saturates and maps
//     NaN to 0, where cvtps2dq gives INT32_MIN for NaN and anything outside [-2^31, 2^31):
//     those lanes are set to INT32_MIN explicitly;
//   packssdw + packsswb: vqmovn_s32 then vqmovn_s16 (both saturating, same clamp);
//   ggml's nearest_int (the 1.5 * 2^23 trick) is done literally, bits and all.
// The per-block fp16 scales go through the reference's own scalar conversion.
#include <cmath>

#include "simd.h"
#include "../fp16.h"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

LB_ARM_INLINE float32x4_t maxps(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }

// ggml's fp32 -> fp16 of the Q8_0 / Q8_1 scales: RNE, NaN -> sign | 0x7e00 (csrc/ref/act.cpp).
LB_ARM_INLINE uint16_t ggml_fp16(float f) {
    if (std::isnan(f)) return (uint16_t)(((f32_to_bits(f) >> 16) & 0x8000u) | 0x7e00u);
    return f32_to_fp16(f);
}

// max |x| of 32 values in ggml's AVX2 order: 8 lanes l fold x[l], x[8+l], x[16+l], x[24+l];
// then lanes 4..7 against 0..3 (maxps(hi, lo)), lanes 2,3 into 0,1, lane 1 into 0.
LB_ARM_INLINE float block_amax(const float *x) {
    const float32x4_t lo = maxps(maxps(maxps(vabsq_f32(vld1q_f32(x)), vabsq_f32(vld1q_f32(x + 8))),
                                       vabsq_f32(vld1q_f32(x + 16))), vabsq_f32(vld1q_f32(x + 24)));
    const float32x4_t hi = maxps(maxps(maxps(vabsq_f32(vld1q_f32(x + 4)), vabsq_f32(vld1q_f32(x + 12))),
                                       vabsq_f32(vld1q_f32(x + 20))), vabsq_f32(vld1q_f32(x + 28)));
    const float32x4_t h = maxps(hi, lo);
    const float32x4_t g = maxps(h, vextq_f32(h, h, 2));  // lanes 0, 1: maxps(h0, h2), maxps(h1, h3)
    const float g0 = vgetq_lane_f32(g, 0), g1 = vgetq_lane_f32(g, 1);
    return g0 > g1 ? g0 : g1;
}

// roundps(imm 0) + cvtps2dq of x * id.
LB_ARM_INLINE int32x4_t round_cvt(float32x4_t v) {
    const uint32x4_t in = vcltq_f32(vabsq_f32(v), vdupq_n_f32(2147483648.0f));  // false for NaN
    return vbslq_s32(in, vcvtnq_s32_f32(v), vdupq_n_s32(INT32_MIN));
}

// 32 values -> 32 int8 (saturated) at q; returns the int32 (wrapping) sum before saturation.
LB_ARM_INLINE int32_t q8_block(const float *x, float id, int8_t *q) {
    int32x4_t sum = vdupq_n_s32(0);
    for (int j = 0; j < 32; j += 8) {
        const int32x4_t i0 = round_cvt(vmulq_n_f32(vld1q_f32(x + j), id));
        const int32x4_t i1 = round_cvt(vmulq_n_f32(vld1q_f32(x + j + 4), id));
        sum = vaddq_s32(sum, vaddq_s32(i0, i1));
        const int16x8_t h = vcombine_s16(vqmovn_s32(i0), vqmovn_s32(i1));
        vst1_s8(q + j, vqmovn_s16(h));
    }
    return vaddvq_s32(sum);
}

void quant_act_q8_0(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / QK; ++b) {
        const float *xb = x + b * QK;
        uint8_t *y = dst + b * sizeof(block_q8_0);
        const float amax = block_amax(xb);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const uint16_t dh = ggml_fp16(d);
        std::memcpy(y, &dh, 2);
        q8_block(xb, id, (int8_t *)(y + 2));
    }
}

void quant_act_q8_1(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / QK; ++b) {
        const float *xb = x + b * QK;
        uint8_t *y = dst + b * sizeof(block_q8_1);
        const float amax = block_amax(xb);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const int32_t sum = q8_block(xb, id, (int8_t *)(y + 4));
        const uint16_t dh = ggml_fp16(d), sh = ggml_fp16(d * (float)sum);
        std::memcpy(y, &dh, 2);
        std::memcpy(y + 2, &sh, 2);
    }
}

// ggml's nearest_int on any float: low 23 bits of (v + 1.5 * 2^23) minus 2^22.
LB_ARM_INLINE int32x4_t nearest_int(float32x4_t v) {
    const int32x4_t bits = vreinterpretq_s32_f32(vaddq_f32(v, vdupq_n_f32(12582912.f)));
    return vsubq_s32(vandq_s32(bits, vdupq_n_s32(0x007fffff)), vdupq_n_s32(0x00400000));
}

// Q8_K (quantize_row_q8_K_ref): max = the FIRST x of largest |x| (NaN never wins), then
// q = min(127, nearest_int(-127 / max * x)) as its low byte, bsums, d = 1 / iscale.
void quant_act_q8_K(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const float *xb = x + b * QK_K;
        uint8_t *yb = dst + b * sizeof(block_q8_K);
        float32x4_t m = vdupq_n_f32(0.f);
        for (int j = 0; j < QK_K; j += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(xb + j)));  // NaN-free max
        const float amax = vmaxnmvq_f32(m);
        if (amax == 0.0f) {
            std::memset(yb, 0, sizeof(block_q8_K));
            continue;
        }
        int first = 0;
        while (!(std::fabs(xb[first]) == amax)) ++first;
        const float iscale = -127.0f / xb[first];
        int8_t *q = (int8_t *)(yb + 4);
        for (int j = 0; j < QK_K; j += 16) {
            int16x8_t h[2];
            for (int k = 0; k < 2; ++k) {
                const int32x4_t a = vminq_s32(nearest_int(vmulq_n_f32(vld1q_f32(xb + j + 8 * k), iscale)), vdupq_n_s32(127));
                const int32x4_t c = vminq_s32(nearest_int(vmulq_n_f32(vld1q_f32(xb + j + 8 * k + 4), iscale)), vdupq_n_s32(127));
                h[k] = vcombine_s16(vmovn_s32(a), vmovn_s32(c));  // low bytes (truncating narrows)
            }
            const int8x16_t v = vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1]));
            vst1q_s8(q + j, v);
            const int16_t s = (int16_t)vaddlvq_s8(v);
            std::memcpy(yb + 4 + QK_K + 2 * (j / 16), &s, 2);
        }
        const float d = 1.0f / iscale;
        std::memcpy(yb, &d, 4);
    }
}

// I8_S (csrc/ref/ternary.cpp): amax over the finite |x|; scale = 127 / amax (1 if amax is 0 or
// the quotient overflows); q = clamp(nearest_int(x * scale), -127, 127), NaN -> 0, +-inf -> +-127.
void quant_act_i8_s(const float *x, uint8_t *dst, int64_t n) {
    const float32x4_t inf = vdupq_n_f32(INFINITY);
    float32x4_t m = vdupq_n_f32(0.f);
    int64_t k = 0;
    for (; k + 4 <= n; k += 4) {
        const float32x4_t ax = vabsq_f32(vld1q_f32(x + k));
        m = vmaxq_f32(m, vbslq_f32(vcltq_f32(ax, inf), ax, vdupq_n_f32(0.f)));  // no NaN reaches vmaxq
    }
    float amax = vmaxvq_f32(m);
    for (; k < n; ++k)
        if (std::isfinite(x[k])) amax = std::fmax(amax, std::fabs(x[k]));
    float scale = 1.f;
    if (amax > 0.f && std::isfinite(127.f / amax)) scale = 127.f / amax;
    int8_t *q = (int8_t *)(dst + I8S_HEADER);
    int32x4_t sum = vdupq_n_s32(0);
    const int32x4_t hi = vdupq_n_s32(127), lo = vdupq_n_s32(-127);
    k = 0;
    for (; k + 4 <= n; k += 4) {
        const float32x4_t xv = vld1q_f32(x + k);
        int32x4_t v = vmaxq_s32(vminq_s32(nearest_int(vmulq_n_f32(xv, scale)), hi), lo);
        const uint32x4_t isinf = vceqq_f32(vabsq_f32(xv), inf), isnan = vmvnq_u32(vceqq_f32(xv, xv));
        const int32x4_t infv = vbslq_s32(vcltzq_f32(xv), lo, hi);
        v = vbslq_s32(isinf, infv, v);
        v = vbslq_s32(isnan, vdupq_n_s32(0), v);
        sum = vaddq_s32(sum, v);
        const int16x4_t h = vmovn_s32(v);
        int8_t tmp[8];
        vst1_s8(tmp, vmovn_s16(vcombine_s16(h, h)));
        std::memcpy(q + k, tmp, 4);
    }
    int32_t total = vaddvq_s32(sum);
    for (; k < n; ++k) {
        int v;
        if (std::isnan(x[k])) v = 0;
        else if (std::isinf(x[k])) v = x[k] > 0 ? 127 : -127;
        else {
            float val = x[k] * scale + 12582912.f;
            int32_t i;
            std::memcpy(&i, &val, 4);
            v = (i & 0x007fffff) - 0x00400000;
        }
        v = v > 127 ? 127 : (v < -127 ? -127 : v);
        q[k] = (int8_t)v;
        total += v;
    }
    std::memcpy(dst, &scale, 4);
    std::memcpy(dst + 4, &total, 4);
}

}  // namespace

void register_act(KernelTable &t) {
    t.set_quant_act(T_Q8_0, quant_act_q8_0, "quant_act_q8_0_" LB_ARM_SUFFIX, LOWBIT_ISA);
    t.set_quant_act(T_Q8_1, quant_act_q8_1, "quant_act_q8_1_" LB_ARM_SUFFIX, LOWBIT_ISA);
    t.set_quant_act(T_Q8_K, quant_act_q8_K, "quant_act_q8_k_" LB_ARM_SUFFIX, LOWBIT_ISA);
    t.set_quant_act(T_I8_S, quant_act_i8_s, "quant_act_i8_s_" LB_ARM_SUFFIX, LOWBIT_ISA);
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
