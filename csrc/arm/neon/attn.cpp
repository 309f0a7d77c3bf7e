// The engine's attention over a half KV cache at the neon level (contract: attn_f16_fn in
// csrc/kernels.h; spec: csrc/ref/attn.cpp), bitwise the reference's: the same rounding points (q
// and each probability rounded to half) and the same operations in the same order per value:
//   scores: 4 keys per float32x4, lane j = key j's dot, each lane summing qr[d] * k_j[d] in d
//           order (the reference's serial sum, multiply then add: no FMA);
//   max, exp (libm, as the reference), sum, the sink's share, 1/sum: the reference's scalar code;
//   V:      out[d] += p_j * v_j[d] over keys j in order, 4 values of d per vector.
// dotprod and i8mm add nothing here (float work); they inherit it.
#include <arm_neon.h>

#include <cmath>
#include <cstring>

#include "../../fp16.h"
#include "../../kernels.h"

namespace lowbit {
namespace neon {
namespace {

inline float32x4_t half4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
inline float half1(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }

void attend_f16_neon(const float *q, const uint16_t *K, const uint16_t *V, int len, int hd, size_t kd, float scale,
                     float sink, float *sc, float *out) {
    float qr[512];  // head_dim <= 512 (the engine checks)
    for (int d = 0; d < hd; ++d) qr[d] = half1(f32_to_fp16(q[d]));
    int j = 0;
    for (; j + 4 <= len; j += 4) {  // 4 keys: lane = key, d in order
        const uint16_t *k0 = K + (size_t)j * kd, *k1 = k0 + kd, *k2 = k1 + kd, *k3 = k2 + kd;
        float32x4_t s = vdupq_n_f32(0.0f);
        for (int d = 0; d < hd; ++d) {
            uint16x4_t h = vdup_n_u16(k0[d]);
            h = vset_lane_u16(k1[d], h, 1);
            h = vset_lane_u16(k2[d], h, 2);
            h = vset_lane_u16(k3[d], h, 3);
            s = vaddq_f32(s, vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(h)), qr[d]));
        }
        vst1q_f32(sc + j, vmulq_n_f32(s, scale));
    }
    for (; j < len; ++j) {
        const uint16_t *k = K + (size_t)j * kd;
        float s = 0.0f;
        for (int d = 0; d < hd; ++d) s += qr[d] * half1(k[d]);
        sc[j] = s * scale;
    }
    float mx = -INFINITY;
    for (j = 0; j < len; ++j) mx = sc[j] > mx ? sc[j] : mx;
    mx = sink > mx ? sink : mx;  // an attention sink joins the max ...
    float sum = 0.0f;
    for (j = 0; j < len; ++j) { sc[j] = std::exp(sc[j] - mx); sum += sc[j]; }
    if (sink > -INFINITY) sum += std::exp(sink - mx);  // ... and the denominator, after the keys
    const float inv = 1.0f / sum;
    for (j = 0; j < len; ++j) sc[j] = half1(f32_to_fp16(sc[j] * inv));  // p_j, rounded to half
    int d = 0;
    for (; d + 4 <= hd; d += 4) {
        float32x4_t o = vdupq_n_f32(0.0f);
        for (j = 0; j < len; ++j) o = vaddq_f32(o, vmulq_n_f32(half4(V + (size_t)j * kd + d), sc[j]));
        vst1q_f32(out + d, o);
    }
    for (; d < hd; ++d) {
        float o = 0.0f;
        for (j = 0; j < len; ++j) o += sc[j] * half1(V[(size_t)j * kd + d]);
        out[d] = o;
    }
}

}  // namespace

void register_attn(KernelTable &t) { t.attn = AttnKernel{attend_f16_neon, "attn_f16_neon", ISA_NEON}; }

}  // namespace neon
}  // namespace lowbit
