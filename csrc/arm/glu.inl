// The FFN's GLU epilogue on aarch64 (contract: glu_fn in csrc/kernels.h; spec: csrc/ref/glu.cpp):
//   SiLU:  out = g / (1 + exp(0 - g)) * u, exp as ggml's vectorised ggml_v_expf
//   ReLU2: out = (g > 0 ? g : 0)^2 * u
// 4 lanes per step with the reference's operations one for one: its std::fmaf are vfmaq / vfmsq
// (fused, one rounding), p * 2^n is (p * 2^n1) * 2^n2 as there, |n| > 192 and NaN lanes are
// selected as there; the last n % 4 values run the reference itself. Bitwise the reference's
// for every input (tests/arm/check.cpp). Built at the neon level (float only: dotprod and i8mm
// add nothing here).
#include "simd.h"
#include "../ref/ref.h"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

LB_ARM_INLINE float32x4_t pow2i(int32x4_t e) {  // 2^e, e in [-126, 127]
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(e, vdupq_n_s32(127)), 23));
}

LB_ARM_INLINE float32x4_t vexp(float32x4_t x) {
    const float32x4_t shift = vdupq_n_f32(0x1.8p23f);
    const float32x4_t z = vfmaq_f32(shift, x, vdupq_n_f32(0x1.715476p+0f));  // fmaf(x, 1/ln2, shift)
    const float32x4_t n = vsubq_f32(z, shift);
    float32x4_t b = vfmsq_f32(x, n, vdupq_n_f32(0x1.62e4p-1f));              // fmaf(-n, ln2_hi, x)
    b = vfmsq_f32(b, n, vdupq_n_f32(0x1.7f7d1cp-20f));                       // fmaf(-n, ln2_lo, b)
    const float32x4_t u = vmulq_f32(b, b);
    const float32x4_t p45 = vfmaq_f32(vdupq_n_f32(0x1.573e2ep-5f), vdupq_n_f32(0x1.0e4020p-7f), b);
    const float32x4_t p23 = vfmaq_f32(vdupq_n_f32(0x1.fffdb6p-2f), vdupq_n_f32(0x1.555e66p-3f), b);
    const float32x4_t p01 = vfmaq_f32(vdupq_n_f32(1.0f), vdupq_n_f32(0x1.ffffecp-1f), b);
    const float32x4_t p = vfmaq_f32(p01, vfmaq_f32(p23, p45, u), u);
    const int32x4_t ni = vcvtq_s32_f32(n);            // exact where |n| <= 192 (other lanes replaced)
    const int32x4_t n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
    float32x4_t r = vmulq_f32(vmulq_f32(p, pow2i(n1)), pow2i(n2));
    const uint32x4_t big = vcagtq_f32(n, vdupq_n_f32(192.0f));  // |n| > 192 (false for NaN)
    const float32x4_t inf_or_0 = vbslq_f32(vcgtzq_f32(n), vdupq_n_f32(INFINITY), vdupq_n_f32(0.0f));
    r = vbslq_f32(big, inf_or_0, r);
    return vbslq_f32(vceqq_f32(n, n), r, n);  // NaN in, that NaN out
}

void glu_neon(const float *g, const float *u, float *out, int64_t n, int kind) {
    if (kind != GLU_SILU && kind != GLU_RELU2) return ref::glu(g, u, out, n, kind);
    int64_t i = 0;
    if (kind == GLU_RELU2) {
        for (; i + 4 <= n; i += 4) {
            const float32x4_t gv = vld1q_f32(g + i);
            const float32x4_t r = vbslq_f32(vcgtzq_f32(gv), gv, vdupq_n_f32(0.0f));  // NaN: 0
            vst1q_f32(out + i, vmulq_f32(vmulq_f32(r, r), vld1q_f32(u + i)));
        }
    } else {
        for (; i + 4 <= n; i += 4) {
            const float32x4_t gv = vld1q_f32(g + i);
            const float32x4_t e = vexp(vsubq_f32(vdupq_n_f32(0.0f), gv));
            vst1q_f32(out + i, vmulq_f32(vdivq_f32(gv, vaddq_f32(vdupq_n_f32(1.0f), e)), vld1q_f32(u + i)));
        }
    }
    if (i < n) ref::glu(g + i, u + i, out + i, n - i, kind);
}

}  // namespace

void register_glu(KernelTable &t) { t.glu = GluKernel{glu_neon, "glu_" LB_ARM_SUFFIX, LOWBIT_ISA}; }

}  // namespace LOWBIT_NS
}  // namespace lowbit
