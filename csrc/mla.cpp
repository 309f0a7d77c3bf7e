// DeepSeek V2/V3 multi-head latent attention (llama.cpp's deepseek2 graph with MLA: its
// src/models/deepseek2.cpp and build_attn_mha's v_mla path in src/llama-graph.cpp), as one
// mixer of the engine's forward pass (EngineConfig::mla_rank > 0).
//
// Per token, with R = mla_rank, nope = head_dim - rope, rope = rope_dims, vd = mla_v_dim:
//   q      = wq x, or wq_b RMSNorm(wq_a x) (q_lora)       [n_head][nope | rope]
//   kv     = wkv_a x                                       [c_kv (R) | k_pe (rope)]
//   k_pe   = rope(k_pe) (one vector for all heads), c_kv = RMSNorm(c_kv) * kv_a_norm
//   cache  <- [c_kv | k_pe]  (the compressed cache: R + rope values per position and layer)
//   q_abs[h] = wk_b[h] q_nope[h]                           [R]  (the absorbed key up-projection)
//   o[h]   = sum_j softmax_j(kq_scale * [q_abs[h] | rope(q_pe[h])] . cache_j) cache_j[0..R)
//   out    = wo [wv_b[h] o[h] for each h]                  (the value up-projection per head)
// The attention is multi-query over the latent rows: one cache row serves every head, so a
// position costs R + rope cached values instead of n_head * (hd + vd) for expanded K/V.
// Rounding points as llama.cpp's (non-flash) graph: q_abs and q_pe as one half-rounded query
// against the half cache, probabilities rounded to half before they weight c_kv, then
// o quantized to wv_b's activation format as ggml's mul_mat does.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "dispatch.h"
#include "engine.h"
#include "fp16.h"
#include "threadpool.h"

namespace lowbit {

// Rotate the rope part of v: rows of `stride` floats, `heads` per token, the rotated dims at
// [off, off + rope_dims) of each (pairs as c_.rope_neox), angles of rot (rope_angles).
static void rope_part(float *v, int T, int heads, int stride, int off, int rope_dims, bool neox,
                      const std::vector<std::pair<float, float>> &rot) {
    const int half = rope_dims / 2;
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < half; ++i) {
            const float cs = rot[(size_t)t * half + i].first, sn = rot[(size_t)t * half + i].second;
            const int a = off + (neox ? i : 2 * i), b = off + (neox ? i + half : 2 * i + 1);
            for (int h = 0; h < heads; ++h) {
                float *x = v + ((size_t)t * heads + h) * stride;
                const float x0 = x[a], x1 = x[b];
                x[a] = x0 * cs - x1 * sn;
                x[b] = x0 * sn + x1 * cs;
            }
        }
}

void Engine::mla_attention(int layer, const float *x, int T, const int32_t *slots, const int32_t *pos, float *out) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int nh = c_.n_head, hd = c_.head_dim, rope = c_.rope_dims, nope = hd - rope, R = c_.mla_rank,
              vd = c_.mla_v_dim, dk = R + rope, Rq = c_.q_lora_rank;
    mq_.resize((size_t)T * nh * hd);
    mkv_.resize((size_t)T * dk);
    // 1. projections: q (directly or through the q_lora bottleneck) and the latent + k rope part
    if (Rq > 0) {
        mqa_.resize((size_t)T * Rq);
        matmuls({{&L.wq_a, mqa_.data()}, {&L.wkv_a, mkv_.data()}}, x, T);  // (one dispatch where the formats pair)
        rmsnorm(mqa_.data(), L.q_a_norm, mqa_.data(), T, Rq);
        matmul(L.wq_b, mqa_.data(), T, mq_.data());
    } else {
        matmuls({{&L.wq, mq_.data()}, {&L.wkv_a, mkv_.data()}}, x, T);
    }
    rope_part(mkv_.data(), T, 1, dk, R, rope, c_.rope_neox, rot_);       // k_pe
    rope_part(mq_.data(), T, nh, hd, nope, rope, c_.rope_neox, rot_);   // q_pe of every head
    for (int t = 0; t < T; ++t) rmsnorm(mkv_.data() + (size_t)t * dk, L.kv_a_norm, mkv_.data() + (size_t)t * dk, 1, R);
    // 2. the compressed cache: [c_kv | k_pe] of each token at its slot and position
    for (int t = 0; t < T; ++t) {
        const size_t at = kv_k_at(slots[t], layer, pos[t]);
        const float *src = mkv_.data() + (size_t)t * dk;
        f32_to_fp16_row(src, k16_.data() + at, dk);  // (a half cache: the constructor)
    }
    // 3. the absorbed queries [T][nh][q_abs (R) | q_pe (rope)]: head h's q_nope through wk_b[h]
    mlat_.resize((size_t)T * nh * dk);
    mqn_.resize((size_t)T * std::max(nope, R));
    mo_h_.resize((size_t)T * std::max(R, vd));
    for (int h = 0; h < nh; ++h) {
        Mat kb = L.wk_b;
        kb.w += (size_t)h * R * kb.stride;
        kb.rows = R;
        for (int t = 0; t < T; ++t)
            std::memcpy(mqn_.data() + (size_t)t * nope, mq_.data() + ((size_t)t * nh + h) * hd, sizeof(float) * nope);
        matmul(kb, mqn_.data(), T, mo_h_.data());
        for (int t = 0; t < T; ++t) {
            float *dst = mlat_.data() + ((size_t)t * nh + h) * dk;
            std::memcpy(dst, mo_h_.data() + (size_t)t * R, sizeof(float) * R);
            std::memcpy(dst + R, mq_.data() + ((size_t)t * nh + h) * hd + nope, sizeof(float) * rope);
        }
    }
    // 4. attention over the latent rows. An item is either a run of up to TB tokens of one slot at
    // consecutive positions with all their heads (prefill: the cache rows read once for all of
    // them), or, with fewer tokens than threads (decode), one token's group of heads. A row's
    // result does not depend on its item (the kernel's contract), so neither do the logits.
    const auto ta = now();
    std::vector<float> &lat = mq_;  // (q is consumed: its buffer holds the latent outputs [T][nh][R])
    lat.resize((size_t)T * nh * R);
    const int threads = threads_ > 0 ? threads_ : ThreadPool::instance().size();
    const int TB = std::max(1, std::min(8, T / threads));  // tokens per item: every thread gets some
    struct Item { int t0, t1, h0, h1; };
    std::vector<Item> items;
    if (T >= threads) {
        for (int t = 0; t < T;) {
            int e = t + 1;
            while (e < T && e - t < TB && slots[e] == slots[t] && pos[e] == pos[e - 1] + 1) ++e;
            items.push_back({t, e, 0, nh});
            t = e;
        }
    } else {
        const int G = std::max(1, std::min(nh, (threads + T - 1) / T));
        for (int t = 0; t < T; ++t)
            for (int g = 0; g < G; ++g) items.push_back({t, t + 1, (int)((int64_t)g * nh / G), (int)((int64_t)(g + 1) * nh / G)});
    }
    const mla_f16_fn kern = kernel_table().mla.fn;
    const int64_t n_items = (int64_t)items.size();
    const int64_t parts = threads > 1 ? std::min<int64_t>(n_items, (int64_t)threads * 4) : 1;
    ThreadPool::instance().run((int)parts, [&](int i, int nth) {
        int64_t b, e;
        split_range(n_items, i, nth, &b, &e);
        std::vector<float> sc;
        std::vector<int32_t> lens;
        for (int64_t it = b; it < e; ++it) {
            const Item &I = items[(size_t)it];
            const int nrow = (I.t1 - I.t0) * (I.h1 - I.h0);  // rows: token-major, then head
            lens.resize((size_t)nrow);
            for (int t = I.t0; t < I.t1; ++t)
                for (int h = I.h0; h < I.h1; ++h) lens[(size_t)((t - I.t0) * (I.h1 - I.h0) + h - I.h0)] = pos[t] + 1;
            const int maxlen = pos[I.t1 - 1] + 1;
            sc.resize((size_t)nrow * maxlen);
            const size_t off = kv_k_at(slots[I.t0], layer, 0);
            const float *qv = mlat_.data() + ((size_t)I.t0 * nh + I.h0) * dk;  // contiguous: all heads, or one token
            float *o = lat.data() + ((size_t)I.t0 * nh + I.h0) * R;
            kern(qv, nrow, lens.data(), k16_.data() + off, k16_.data() + off, dk, R, kv_row_, c_.mla_kq_scale, nullptr, 0.0f,
                 sc.data(), o);
        }
    });
    if (stats_on_) stats_[(size_t)layer].t_attn_core += seconds(ta, now());
    // 5. per head the value up-projection wv_b[h] of its latent output, then wo
    att_.resize((size_t)T * nh * vd);
    for (int h = 0; h < nh; ++h) {
        Mat vb = L.wv_b;
        vb.w += (size_t)h * vd * vb.stride;
        vb.rows = vd;
        mqn_.resize((size_t)T * R);
        for (int t = 0; t < T; ++t)
            std::memcpy(mqn_.data() + (size_t)t * R, lat.data() + ((size_t)t * nh + h) * R, sizeof(float) * R);
        matmul(vb, mqn_.data(), T, mo_h_.data());
        for (int t = 0; t < T; ++t)
            std::memcpy(att_.data() + ((size_t)t * nh + h) * vd, mo_h_.data() + (size_t)t * vd, sizeof(float) * vd);
    }
    matmul(L.wo, att_.data(), T, out);
    if (stats_on_)
        stats_[(size_t)layer].weight_bytes += mat_bytes(L.wq_a) + mat_bytes(L.wq_b) + mat_bytes(L.wkv_a) +
                                              mat_bytes(L.wk_b) + mat_bytes(L.wv_b);
}

}  // namespace lowbit
