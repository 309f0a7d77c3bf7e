// The engine's attention over a half KV cache at the neon level (contract: attn_f16_fn in
// csrc/kernels.h; spec: csrc/ref/attn.cpp), bitwise the reference's: the same rounding points (q
// and each probability rounded to half) and the same operations in the same order per value:
//   scores: 4 keys per float32x4, lane j = key j's dot, each lane summing qr[d] * k_j[d] in d
//           order (the reference's serial sum, multiply then add: no FMA);
//   max, exp (libm, as the reference), sum, the sink's share, 1/sum: the reference's scalar code;
//   V:      out[d] += p_j * v_j[d] over keys j in order, 4 values of d per vector.
// dotprod and i8mm add nothing here (float work); they inherit it.
//
// DeepSeek MLA (mla_f16_fn, spec ref::mla_f16) at the neon level, bitwise the reference: per
// query row the arithmetic above without a sink, dk-wide scores and dv-wide values read from the
// same latent cache rows, which every query row of the call shares (MQA). So a cache row is
// widened once per call and serves every row:
//   scores: keys by 4, their dk values widened and transposed into kt[d] (lane = key, 9 KB for
//           dk = 576) once, then for each query row (two at a time, sharing each kt load) lane j
//           sums qr[d] * k_j[d] in d order, multiply then add (no FMA), exactly the reference's
//           serial sum; keys below len & ~3 of the longest row (all exist), the rest one by one;
//   max, exp (libm, as the reference), sum, 1/sum, p_j rounded to half: the reference's scalar
//           code per row over its own lens[r] keys; p_j = 0 for its keys up to the call's
//           longest row (see the values);
//   values: out[r][d] += p_rj * v_j[d] over keys j in order from +0, 4 rows x 16 dims of
//           accumulators per pass, keys in blocks of KB (their rows stay in L1 while every row
//           group and dim chunk reads them; the accumulators go through out between blocks,
//           exactly). A row shorter than its group's longest adds p = 0 terms past its keys:
//           0 * v = +-0 for finite v (the contract), and acc + +-0 = acc for every acc the sum can
//           hold (it starts at +0 and a sum is never -0 in round-to-nearest unless both terms
//           are), so its result is the reference's on its own keys.
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "../../fp16.h"
#include "../../kernels.h"
#include "../../ref/ref.h"

namespace lowbit {
namespace neon {
namespace {

inline float32x4_t half4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
inline float half1(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }

void attend_f16_neon(const float *q, const uint16_t *K, const uint16_t *V, int len, int hd, size_t kd, float scale,
                     float sink, float softcap, float *sc, float *out) {
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
    if (softcap > 0.0f) ref::softcap_scores(sc, len, softcap);
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

constexpr int KB = 64;  // keys per value block

// Scores of query rows q0 (and q1 if TWO) against the 4 keys of kt (kt[4 d + lane]): lane = key.
template <bool TWO>
inline void scores_4(const float *q0, const float *q1, const float *kt, int dk, float32x4_t &s0, float32x4_t &s1) {
    float32x4_t a = vdupq_n_f32(0.0f), b = a;
    int d = 0;
    for (; d + 4 <= dk; d += 4) {
        const float32x4_t x = vld1q_f32(q0 + d), y = TWO ? vld1q_f32(q1 + d) : x;
        const float32x4_t k0 = vld1q_f32(kt + 4 * d), k1 = vld1q_f32(kt + 4 * d + 4);
        const float32x4_t k2 = vld1q_f32(kt + 4 * d + 8), k3 = vld1q_f32(kt + 4 * d + 12);
        a = vaddq_f32(a, vmulq_laneq_f32(k0, x, 0));
        a = vaddq_f32(a, vmulq_laneq_f32(k1, x, 1));
        a = vaddq_f32(a, vmulq_laneq_f32(k2, x, 2));
        a = vaddq_f32(a, vmulq_laneq_f32(k3, x, 3));
        if (TWO) {
            b = vaddq_f32(b, vmulq_laneq_f32(k0, y, 0));
            b = vaddq_f32(b, vmulq_laneq_f32(k1, y, 1));
            b = vaddq_f32(b, vmulq_laneq_f32(k2, y, 2));
            b = vaddq_f32(b, vmulq_laneq_f32(k3, y, 3));
        }
    }
    for (; d < dk; ++d) {
        const float32x4_t k = vld1q_f32(kt + 4 * d);
        a = vaddq_f32(a, vmulq_n_f32(k, q0[d]));
        if (TWO) b = vaddq_f32(b, vmulq_n_f32(k, q1[d]));
    }
    s0 = a;
    s1 = b;
}

// out rows r..r+HB-1 (stride dv), dims [d0, d0 + 4 DC): += p_rj * v_j over keys j0..j1-1 in order.
template <int HB, int DC>
inline void mla_pv(const float *sc, size_t ld, const uint16_t *C, size_t kd, int j0, int j1, int d0, float *out, int dv) {
    float32x4_t acc[HB][DC];
    for (int h = 0; h < HB; ++h)
        for (int c = 0; c < DC; ++c) acc[h][c] = vld1q_f32(out + (size_t)h * dv + d0 + 4 * c);
    for (int j = j0; j < j1; ++j) {
        const uint16_t *v = C + (size_t)j * kd + d0;
        float32x4_t vv[DC];
        for (int c = 0; c < DC; ++c) vv[c] = half4(v + 4 * c);
        for (int h = 0; h < HB; ++h) {
            const float p = sc[(size_t)h * ld + j];
            for (int c = 0; c < DC; ++c) acc[h][c] = vaddq_f32(acc[h][c], vmulq_n_f32(vv[c], p));
        }
    }
    for (int h = 0; h < HB; ++h)
        for (int c = 0; c < DC; ++c) vst1q_f32(out + (size_t)h * dv + d0 + 4 * c, acc[h][c]);
}

template <int HB>
inline void mla_pv_rows(const float *sc, size_t ld, const uint16_t *C, size_t kd, int j0, int j1, float *out, int dv) {
    int d0 = 0;
    for (; d0 + 16 <= dv; d0 += 16) mla_pv<HB, 4>(sc, ld, C, kd, j0, j1, d0, out, dv);
    for (; d0 + 4 <= dv; d0 += 4) mla_pv<HB, 1>(sc, ld, C, kd, j0, j1, d0, out, dv);
    for (; d0 < dv; ++d0)  // (dv not a multiple of 4: one lane at a time, the same order)
        for (int h = 0; h < HB; ++h) {
            float o = out[(size_t)h * dv + d0];
            for (int j = j0; j < j1; ++j) o += sc[(size_t)h * ld + j] * half1(C[(size_t)j * kd + d0]);
            out[(size_t)h * dv + d0] = o;
        }
}

void mla_f16_neon(const float *q, int nq, const int32_t *lens, const uint16_t *C, const uint16_t *V, int dk, int dv,
                  size_t kd, float scale, const float *sinks, float softcap, float *sc, float *out) {
    int maxlen = 0;
    for (int r = 0; r < nq; ++r) maxlen = std::max(maxlen, (int)lens[r]);
    const size_t ld = (size_t)maxlen;  // row r's scores / probabilities at sc + r * ld
    std::vector<float> qr((size_t)nq * dk), kt((size_t)4 * dk);
    for (size_t i = 0; i < (size_t)nq * dk; ++i) qr[i] = half1(f32_to_fp16(q[i]));
    // scores
    const int full = maxlen & ~3;
    int j = 0;
    for (; j < full; j += 4) {
        const uint16_t *k0 = C + (size_t)j * kd, *k1 = k0 + kd, *k2 = k1 + kd, *k3 = k2 + kd;
        for (int d = 0; d < dk; ++d) {
            uint16x4_t h = vdup_n_u16(k0[d]);
            h = vset_lane_u16(k1[d], h, 1);
            h = vset_lane_u16(k2[d], h, 2);
            h = vset_lane_u16(k3[d], h, 3);
            vst1q_f32(&kt[(size_t)4 * d], vcvt_f32_f16(vreinterpret_f16_u16(h)));
        }
        int r = 0;
        float32x4_t s0, s1;
        for (; r + 2 <= nq; r += 2) {
            scores_4<true>(&qr[(size_t)r * dk], &qr[(size_t)(r + 1) * dk], kt.data(), dk, s0, s1);
            vst1q_f32(sc + (size_t)r * ld + j, vmulq_n_f32(s0, scale));
            vst1q_f32(sc + (size_t)(r + 1) * ld + j, vmulq_n_f32(s1, scale));
        }
        if (r < nq) {
            scores_4<false>(&qr[(size_t)r * dk], nullptr, kt.data(), dk, s0, s1);
            vst1q_f32(sc + (size_t)r * ld + j, vmulq_n_f32(s0, scale));
        }
    }
    for (; j < maxlen; ++j) {
        const uint16_t *k = C + (size_t)j * kd;
        for (int r = 0; r < nq; ++r) {
            const float *x = &qr[(size_t)r * dk];
            float a = 0.0f;
            for (int d = 0; d < dk; ++d) a += x[d] * half1(k[d]);
            sc[(size_t)r * ld + j] = a * scale;
        }
    }
    // softmax per row over its own keys; 0 for the keys past them
    for (int r = 0; r < nq; ++r) {
        float *s = sc + (size_t)r * ld;
        const int len = lens[r];
        if (softcap > 0.0f) ref::softcap_scores(s, len, softcap);
        float mx = -INFINITY;
        for (j = 0; j < len; ++j) mx = s[j] > mx ? s[j] : mx;
        const float sink = sinks ? sinks[r] : -INFINITY;
        mx = sink > mx ? sink : mx;
        float sum = 0.0f;
        for (j = 0; j < len; ++j) { s[j] = std::exp(s[j] - mx); sum += s[j]; }
        if (sink > -INFINITY) sum += std::exp(sink - mx);  // the sink's share of the denominator
        const float inv = 1.0f / sum;
        for (j = 0; j < len; ++j) s[j] = half1(f32_to_fp16(s[j] * inv));
        for (; j < maxlen; ++j) s[j] = 0.0f;
    }
    // values
    for (size_t i = 0; i < (size_t)nq * dv; ++i) out[i] = 0.0f;
    for (int j0 = 0; j0 < maxlen; j0 += KB) {
        const int j1 = std::min(maxlen, j0 + KB);
        int r = 0;
        for (; r + 4 <= nq; r += 4) {
            const int m = std::max(std::max(lens[r], lens[r + 1]), std::max(lens[r + 2], lens[r + 3]));
            if (m > j0) mla_pv_rows<4>(sc + (size_t)r * ld, ld, V, kd, j0, std::min(j1, m), out + (size_t)r * dv, dv);
        }
        for (; r < nq; ++r)
            if (lens[r] > j0) mla_pv_rows<1>(sc + (size_t)r * ld, ld, V, kd, j0, std::min(j1, (int)lens[r]), out + (size_t)r * dv, dv);
    }
}

}  // namespace

void register_attn(KernelTable &t) {
    t.attn = AttnKernel{attend_f16_neon, "attn_f16_neon", ISA_NEON};
    t.mla = MlaKernel{mla_f16_neon, "mla_f16_neon", ISA_NEON};
}

}  // namespace neon
}  // namespace lowbit
