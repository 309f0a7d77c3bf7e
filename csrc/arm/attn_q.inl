// The engine's attention over a quantized KV cache (--kv q8_0 | q4_0) at the aarch64 levels: the
// body of csrc/arm/<level>/attn_q.cpp (neon, dotprod; i8mm inherits dotprod's). Contract: attn_q_fn
// in csrc/kernels.h; the spec is ref::attend_q (csrc/ref/attn.cpp), and every output is bitwise
// the reference's:
//   scores:  4 keys per float32x4 (lane = key). A block's isum is the exact int32 dot of the
//            codes (dot16: SMULL / SADALP at neon, SDOT at dotprod; any grouping is exact), then
//            the reference's float term in its order: (float)isum * (dk * dq) for K Q8_0,
//            ((float)isum * dk) * dq for K Q4_0, added block by block; then * scale.
//   max:     lane-wise `s > m ? s : m` (a NaN score never wins, as in the reference), then
//            the 4 lanes and the tail keys the same way; then the sink.
//   exp:     exp4, ref::attn_exp lane for lane (the same constants and IEEE mul / add steps;
//            -ffp-contract=off keeps them unfused); tail keys and the sink: ref::attn_exp.
//   sum:     the reference's 8 striped partial sums as two vectors (lanes j mod 8 = 0..3 and
//            4..7) over the keys below len & ~7, joined ((p0 + p1) + (p2 + p3)) + ((p4 + p5) +
//            (p6 + p7)) with pairwise adds, then the tail keys in order, then the sink's share.
//   V:       out[d] = sum over keys j in order of (v_j[d] * e_j), v_j[d] = (float)code * d_v
//            (or the half, exactly), 32 dims (one cache block) per pass in 8 accumulators
//            that stay in registers across all keys; then * (1 / sum).
// The cache is read where it lies (no dequantized copy).
#include <cmath>
#include <cstring>

#include "../ref/ref.h"
#include "simd.h"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

template <int KT>
constexpr size_t kbytes() { return KT == T_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0); }

// Block b of a K row as 32 int8 codes in value order (Q4_0: nibble - 8; low nibbles are 0..15).
template <int KT>
LB_ARM_INLINE void kcodes(const uint8_t *blk, int8x16_t &lo, int8x16_t &hi) {
    if constexpr (KT == T_Q8_0) {
        lo = vld1q_s8((const int8_t *)(blk + 2));
        hi = vld1q_s8((const int8_t *)(blk + 18));
    } else {
        const uint8x16_t x = vld1q_u8(blk + 2);
        lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
        hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(x, 4)), vdupq_n_s8(8));
    }
}

// Unscaled scores of keys k, k + ks, ... (C of them, 1..4): lane i = key i; lanes >= C are 0
// (nothing is read for them).
template <int KT, int C>
LB_ARM_INLINE float32x4_t score(const uint8_t *k, size_t ks, const block_q8_0 *q, int nb) {
    float32x4_t s = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; ++b) {
        const size_t o = (size_t)b * kbytes<KT>();
        const int8x16_t y0 = vld1q_s8(q[b].qs), y1 = vld1q_s8(q[b].qs + 16);
        const int32x4_t isum = per_token<C>(k + o, ks, [&](const uint8_t *blk) LB_ARM_LAMBDA {
            int8x16_t lo, hi;
            kcodes<KT>(blk, lo, hi);
            return dot16(dot16(vdupq_n_s32(0), lo, y0), hi, y1);
        });
        const float32x4_t dk = f16_lanes<C>(k + o, ks, 0);
        const float32x4_t dq = vdupq_n_f32(f16((const uint8_t *)&q[b].d));
        const float32x4_t f = vcvtq_f32_s32(isum);
        s = vaddq_f32(s, KT == T_Q8_0 ? vmulq_f32(f, vmulq_f32(dk, dq)) : vmulq_f32(vmulq_f32(f, dk), dq));
    }
    return s;
}

// ref::attn_exp lane for lane.
LB_ARM_INLINE float32x4_t exp4(float32x4_t x) {
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));  // nearest even
    float32x4_t r = vsubq_f32(x, vmulq_n_f32(n, 0.693145751953125f));
    r = vsubq_f32(r, vmulq_n_f32(n, 1.428606765330187045e-06f));
    float32x4_t p = vdupq_n_f32(1.0f / 720);
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(1.0f / 120));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(1.0f / 24));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(1.0f / 6));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(0.5f));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(1.0f));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(1.0f));
    // n > -126 ? n : -126 (a NaN n gives -126, as the reference's comparison does)
    const float32x4_t lo = vdupq_n_f32(-126.0f);
    const float32x4_t nc = vbslq_f32(vcgtq_f32(n, lo), n, lo);
    const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(nc), vdupq_n_s32(127)), 23);
    const float32x4_t e = vmulq_f32(p, vreinterpretq_f32_s32(bits));
    return vbslq_f32(vcltq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(0.0f), e);
}

// 32 values (one block) of a V row from value index i0 (a multiple of 32), exactly, as 8 x 4.
template <int VT>
LB_ARM_INLINE void vblock(const uint8_t *row, int i0, float32x4_t v[8]) {
    if constexpr (VT == T_F16) {
        const uint16_t *h = (const uint16_t *)(row + 2 * (size_t)i0);
        for (int c = 0; c < 8; ++c) v[c] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + 4 * c)));
        return;
    }
    int8x16_t lo, hi;
    float d;
    if constexpr (VT == T_Q8_0) {
        const uint8_t *b = row + (size_t)(i0 / QK) * sizeof(block_q8_0);
        lo = vld1q_s8((const int8_t *)(b + 2));
        hi = vld1q_s8((const int8_t *)(b + 18));
        d = f16(b);
    } else {
        const uint8_t *b = row + (size_t)(i0 / QK) * sizeof(block_q4_0);
        kcodes<T_Q4_0>(b, lo, hi);
        d = f16(b);
    }
    const int16x8_t w0 = vmovl_s8(vget_low_s8(lo)), w1 = vmovl_high_s8(lo);
    const int16x8_t w2 = vmovl_s8(vget_low_s8(hi)), w3 = vmovl_high_s8(hi);
    v[0] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w0))), d);
    v[1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(w0)), d);
    v[2] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w1))), d);
    v[3] = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(w1)), d);
    v[4] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w2))), d);
    v[5] = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(w2)), d);
    v[6] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w3))), d);
    v[7] = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(w3)), d);
}

// out[d0 .. d0 + 32) = (sum_j v_j * e_j) * inv
template <int VT>
LB_ARM_INLINE void pv_block(const float *e, const uint8_t *V, size_t vs, int len, int d0, float inv, float *out) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int j = 0; j < len; ++j) {
        float32x4_t v[8];
        vblock<VT>(V + (size_t)j * vs, d0, v);
        const float ej = e[j];
        a0 = vaddq_f32(a0, vmulq_n_f32(v[0], ej));
        a1 = vaddq_f32(a1, vmulq_n_f32(v[1], ej));
        a2 = vaddq_f32(a2, vmulq_n_f32(v[2], ej));
        a3 = vaddq_f32(a3, vmulq_n_f32(v[3], ej));
        a4 = vaddq_f32(a4, vmulq_n_f32(v[4], ej));
        a5 = vaddq_f32(a5, vmulq_n_f32(v[5], ej));
        a6 = vaddq_f32(a6, vmulq_n_f32(v[6], ej));
        a7 = vaddq_f32(a7, vmulq_n_f32(v[7], ej));
    }
    float *o = out + d0;
    vst1q_f32(o, vmulq_n_f32(a0, inv));
    vst1q_f32(o + 4, vmulq_n_f32(a1, inv));
    vst1q_f32(o + 8, vmulq_n_f32(a2, inv));
    vst1q_f32(o + 12, vmulq_n_f32(a3, inv));
    vst1q_f32(o + 16, vmulq_n_f32(a4, inv));
    vst1q_f32(o + 20, vmulq_n_f32(a5, inv));
    vst1q_f32(o + 24, vmulq_n_f32(a6, inv));
    vst1q_f32(o + 28, vmulq_n_f32(a7, inv));
}

template <int KT, int VT>
void attend(const uint8_t *qq, const uint8_t *K, size_t ks, const uint8_t *V, size_t vs, int len, int hd, float scale,
            float sink, float softcap, float *sc, float *out) {
    const auto *q = reinterpret_cast<const block_q8_0 *>(qq);
    const int nb = hd / QK;
    // scores, 4 keys at a time; the max as the reference takes it (NaN never wins)
    float32x4_t vmax = vdupq_n_f32(-INFINITY);
    const int full4 = len & ~3;
    int j = 0;
    for (; j < full4; j += 4) {
        const float32x4_t s = vmulq_n_f32(score<KT, 4>(K + (size_t)j * ks, ks, q, nb), scale);
        vst1q_f32(sc + j, s);
        vmax = vbslq_f32(vcgtq_f32(s, vmax), s, vmax);
    }
    float mx = -INFINITY;
    for (int l = 0; l < 4; ++l) {
        const float m = vgetq_lane_f32(vmax, 0);
        mx = m > mx ? m : mx;
        vmax = vextq_f32(vmax, vmax, 1);
    }
    for (; j < len; ++j) {
        sc[j] = vgetq_lane_f32(score<KT, 1>(K + (size_t)j * ks, ks, q, nb), 0) * scale;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    if (softcap > 0.0f) mx = ref::softcap_scores(sc, len, softcap);
    mx = sink > mx ? sink : mx;
    // e_j, and the sum: 8 striped partials over the keys below len & ~7, then the rest in order
    const float32x4_t vmx = vdupq_n_f32(mx);
    const int full8 = len & ~7;
    float32x4_t p03 = vdupq_n_f32(0.0f), p47 = p03;
    for (j = 0; j < full8; j += 8) {
        const float32x4_t e0 = exp4(vsubq_f32(vld1q_f32(sc + j), vmx));
        const float32x4_t e1 = exp4(vsubq_f32(vld1q_f32(sc + j + 4), vmx));
        vst1q_f32(sc + j, e0);
        vst1q_f32(sc + j + 4, e1);
        p03 = vaddq_f32(p03, e0);
        p47 = vaddq_f32(p47, e1);
    }
    const float32x4_t h = vpaddq_f32(p03, p47);  // p0+p1, p2+p3, p4+p5, p6+p7
    float sum = vgetq_lane_f32(vpaddq_f32(h, h), 0) + vgetq_lane_f32(vpaddq_f32(h, h), 1);
    for (; j < len; ++j) {
        sc[j] = ref::attn_exp(sc[j] - mx);
        sum = sum + sc[j];
    }
    if (sink > -INFINITY) sum = sum + ref::attn_exp(sink - mx);
    const float inv = 1.0f / sum;
    for (int d0 = 0; d0 < hd; d0 += QK) pv_block<VT>(sc, V, vs, len, d0, inv, out);
}

template <int KT>
void attend_k(const uint8_t *qq, int v_type, const uint8_t *K, size_t ks, const uint8_t *V, size_t vs, int len,
              int hd, float scale, float sink, float softcap, float *sc, float *out) {
    if (v_type == T_Q8_0) attend<KT, T_Q8_0>(qq, K, ks, V, vs, len, hd, scale, sink, softcap, sc, out);
    else if (v_type == T_Q4_0) attend<KT, T_Q4_0>(qq, K, ks, V, vs, len, hd, scale, sink, softcap, sc, out);
    else attend<KT, T_F16>(qq, K, ks, V, vs, len, hd, scale, sink, softcap, sc, out);
}

// k_type T_Q8_0 / T_Q4_0, v_type T_F16 / T_Q8_0 / T_Q4_0 (the engine checks), hd a multiple of 32
void attend_q_arm(const uint8_t *qq, int k_type, const uint8_t *K, size_t ks, int v_type, const uint8_t *V, size_t vs,
                  int len, int hd, float scale, float sink, float softcap, float *sc, float *out) {
    if (k_type == T_Q8_0) attend_k<T_Q8_0>(qq, v_type, K, ks, V, vs, len, hd, scale, sink, softcap, sc, out);
    else attend_k<T_Q4_0>(qq, v_type, K, ks, V, vs, len, hd, scale, sink, softcap, sc, out);
}

}  // namespace

// The rows sharing a head's cache rows (attn_q_rows_fn): no shared kernel at these levels yet,
// the rows one by one through this level's kernel (bitwise the contract; each row reads the cache).
void register_attn_q(KernelTable &t) {
    t.attnq = AttnQKernel{attend_q_arm, "attn_q_" LB_ARM_SUFFIX, LOWBIT_ISA};
    t.attnq_rows = AttnQRowsKernel{attn_q_rows_by_row<attend_q_arm>, "attn_q_rows_by_row_" LB_ARM_SUFFIX, LOWBIT_ISA};
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
