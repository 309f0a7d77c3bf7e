// The gated delta-net linear-attention layer of the hybrid Qwen models (llama.cpp's qwen35,
// qwen35moe, qwen3next: src/models/qwen35moe.cpp, delta-net-base.cpp, ggml's
// GGML_OP_GATED_DELTA_NET). Shapes, with S = ssm_state (head width), H_k = ssm_groups (q / k
// heads), H_v = ssm_heads (value heads), K = ssm_conv, conv_dim = 2 H_k S + H_v S:
//
//   1. projections of the normed input x[T][dim] (row kernels, one quantized copy of x):
//      qkv[T][conv_dim] = attn_qkv . x (q [H_k][S], k [H_k][S], v [H_v][S]); z[T][H_v S] = attn_gate . x;
//      beta_raw, alpha_raw [T][H_v] = ssm_beta . x, ssm_alpha . x (qwen3next: one ssm_ba matrix
//      whose rows are, per q/k head g, [beta of its r value heads, alpha of them], r = H_v / H_k).
//   2. per token, in order, per channel c: the causal depthwise conv1d over the last K inputs
//      (K-1 from the conv state, oldest first, then this token's), sum in tap order, then silu;
//      the state shifts by one input.
//   3. q and k l2-normalised per head (ggml: rms_norm(x, eps / S) * 1/sqrt(S)).
//   4. gates: g = softplus(alpha_raw + ssm_dt) * ssm_a (ssm_a = -exp(A_log)), beta = sigmoid(beta_raw).
//   5. per value head h (its q / k head: h % H_k, or h / r with ssm_kv_interleave), per token in
//      order, the delta rule on the state M[j][i] (row j = value index, i = key index; ggml's
//      layout): M *= exp(g); d[j] = (v[j] - M[j] . k) * beta; M[j] += k * d[j];
//      o[j] = (M[j] . q) / sqrt(S). Each row j is independent, so the kernel (delta_fn in
//      kernels.h: scalar reference, avx2) does all four steps row by row while the row is in L1
//      (the same values as ggml's four passes over the whole state, up to its dot order).
//   6. the gated RMS norm per head: rmsnorm(o) * ssm_norm * silu(z); then ssm_out.
//
// The conv (step 2), the grouping of a batch's tokens by slot and the replay log are shared with
// LFM2's short-conv block (csrc/shortconv.cpp): conv_runs, slot_runs, tlog_write.
//
// Prefill runs the same token loop as decode (llama.cpp's CPU path, the fused GDN op, does too):
// a token's arithmetic never depends on the window it arrived in, so logits and states are
// bitwise the same for any chunking of a prompt (I8), which speculative rewinds rely on.
// Threads split the work by (slot, channel range) and (slot, value head); neither changes any
// value's operation order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "engine.h"
#include "kernels.h"
#include "threadpool.h"

namespace lowbit {

int Engine::conv_dim() const {
    if (c_.shortconv) return c_.dim;
    if (c_.mamba1) return c_.ssm_inner;
    if (c_.mamba2) return c_.ssm_inner + 2 * c_.ssm_groups * c_.ssm_state;
    return (2 * c_.ssm_groups + c_.ssm_heads) * c_.ssm_state;
}

size_t Engine::conv_state_floats() const { return (size_t)conv_dim() * (size_t)(c_.ssm_conv - 1); }

size_t Engine::ssm_state_floats() const {
    if (c_.shortconv) return 0;
    if (c_.mamba2 || c_.mamba1) return (size_t)c_.ssm_inner * c_.ssm_state;
    return (size_t)c_.ssm_heads * c_.ssm_state * c_.ssm_state;
}

void Engine::rstate_clear(int slot) {
    const size_t cs = (size_t)n_rec_layers_ * conv_state_floats(), ss = (size_t)n_rec_layers_ * ssm_state_floats();
    std::memset(conv_st_.data() + (size_t)slot * cs, 0, cs * sizeof(float));
    std::memset(ssm_st_.data() + (size_t)slot * ss, 0, ss * sizeof(float));
    rpos_[(size_t)slot] = 0;
}

size_t Engine::rstate_bytes() const {
    return sizeof(int64_t) + (size_t)n_rec_layers_ * (conv_state_floats() + ssm_state_floats()) * sizeof(float);
}

void Engine::rstate_copy(int slot, uint8_t *buf, bool save) {
    if (slot < 0 || slot >= c_.n_slots) throw std::invalid_argument("rstate_copy: no slot " + std::to_string(slot));
    const size_t cs = (size_t)n_rec_layers_ * conv_state_floats() * sizeof(float);
    const size_t ss = (size_t)n_rec_layers_ * ssm_state_floats() * sizeof(float);
    uint8_t *conv = reinterpret_cast<uint8_t *>(conv_st_.data()) + (size_t)slot * cs;
    uint8_t *ssm = reinterpret_cast<uint8_t *>(ssm_st_.data()) + (size_t)slot * ss;
    if (save) {
        const int64_t p = rpos_[(size_t)slot];
        std::memcpy(buf, &p, sizeof p);
        std::memcpy(buf + sizeof p, conv, cs);
        std::memcpy(buf + sizeof p + cs, ssm, ss);
    } else {
        int64_t p;
        std::memcpy(&p, buf, sizeof p);
        if (p < 0 || p > c_.n_ctx) throw std::invalid_argument("rstate_copy: the buffer's position is out of range");
        rpos_[(size_t)slot] = (int32_t)p;
        std::memcpy(conv, buf + sizeof p, cs);
        std::memcpy(ssm, buf + sizeof p + cs, ss);
    }
}

void Engine::deltanet(int layer, const float *x, int T, const int32_t *slots, float *out) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int S = c_.ssm_state, Hk = c_.ssm_groups, Hv = c_.ssm_heads;
    const int kdim = Hk * S, vd = Hv * S, cd = 2 * kdim + vd, r = Hv / Hk;

    // 1. projections (q/k/v, z, beta, alpha share one quantized copy of x where formats pair)
    dq_.resize((size_t)T * cd);
    dz_.resize((size_t)T * vd);
    dg_.resize((size_t)T * Hv);
    db_.resize((size_t)T * Hv);
    if (L.ssm_ba.present()) dab_.resize((size_t)T * 2 * Hv);
    matmuls({{&L.wqkv, dq_.data()}, {&L.wqkv_gate, dz_.data()}, {&L.ssm_ba, dab_.data()},
             {&L.ssm_beta, db_.data()}, {&L.ssm_alpha, dg_.data()}}, x, T);  // (one dispatch; absent ones skipped)
    if (L.ssm_ba.present()) {
        for (int t = 0; t < T; ++t)
            for (int g = 0; g < Hk; ++g)
                for (int j = 0; j < r; ++j) {
                    const float *ba = dab_.data() + (size_t)t * 2 * Hv + (size_t)g * 2 * r;
                    db_[(size_t)t * Hv + g * r + j] = ba[j];
                    dg_[(size_t)t * Hv + g * r + j] = ba[r + j];
                }
    }
    // 4. gates, per (token, value head): dg_ = g (log decay), db_ = beta
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < Hv; ++h) {
            const float a = dg_[(size_t)t * Hv + h] + L.ssm_dt[h];
            dg_[(size_t)t * Hv + h] = softplus_f32(a) * L.ssm_a[h];
            db_[(size_t)t * Hv + h] = 1.0f / (1.0f + std::exp(-db_[(size_t)t * Hv + h]));
        }

    const SlotRuns runs = slot_runs(slots, T, c_.n_slots);
    tlog_write(layer, runs, [&](size_t t, float *dst) {  // the replay log: what the state update takes
        std::memcpy(dst, dq_.data() + t * cd, sizeof(float) * cd);
        std::memcpy(dst + cd, dg_.data() + t * Hv, sizeof(float) * Hv);
        std::memcpy(dst + cd + Hv, db_.data() + t * Hv, sizeof(float) * Hv);
    });
    deltanet_state(layer, T, runs);

    // 6. gated RMS norm per (token, head), then the output projection
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < Hv; ++h) {
            float *o = dout_.data() + (size_t)t * vd + (size_t)h * S;
            const float *z = dz_.data() + (size_t)t * vd + (size_t)h * S;
            double ss = 0.0;
            for (int j = 0; j < S; ++j) ss += (double)(o[j] * o[j]);
            const float sc = 1.0f / std::sqrt((float)(ss / S) + c_.eps);
            for (int j = 0; j < S; ++j) o[j] = ((o[j] * sc) * L.ssm_norm[j]) * silu_f32(z[j]);
        }
    matmul(L.ssm_out, dout_.data(), T, out);
}

Engine::SlotRuns Engine::slot_runs(const int32_t *slots, int T, int n_slots) {
    SlotRuns r;
    std::vector<uint8_t> seen((size_t)n_slots, 0);
    for (int t = 0; t < T; ++t) {
        if (seen[(size_t)slots[t]]) continue;
        seen[(size_t)slots[t]] = 1;
        r.slot.push_back(slots[t]);
        for (int u = t; u < T; ++u) if (slots[u] == slots[t]) r.tok.push_back(u);
        r.off.push_back((int)r.tok.size());
    }
    return r;
}

void Engine::tlog_write(int layer, const SlotRuns &r, const std::function<void(size_t, float *)> &row) {
    const size_t lrow = tlog_row();
    const int rl = rec_index_[(size_t)layer];
    for (size_t run = 0; run < r.slot.size(); ++run) {
        const int n = r.off[run + 1] - r.off[run];
        if (n < 2 || n > kReplayMax) continue;
        if (tlog_.empty()) tlog_.resize((size_t)c_.n_slots * n_rec_layers_ * kReplayMax * lrow);
        float *dst = tlog_.data() + ((size_t)r.slot[run] * n_rec_layers_ + rl) * kReplayMax * lrow;
        for (int k = 0; k < n; ++k, dst += lrow) row((size_t)r.tok[(size_t)r.off[run] + k], dst);
    }
}

void Engine::rstate_replay(int slot, int n) {
    if (slot < 0 || slot >= c_.n_slots) throw std::invalid_argument("rstate_replay: no slot " + std::to_string(slot));
    const int p0 = tlog_p0_[(size_t)slot], ln = tlog_n_[(size_t)slot];
    if (n < 0 || n > ln || rpos_[(size_t)slot] != p0)
        throw std::invalid_argument("rstate_replay: the log holds " + std::to_string(ln) + " tokens from position " +
                                    std::to_string(p0) + ", the state is at " + std::to_string(rpos_[(size_t)slot]) +
                                    ", asked for " + std::to_string(n));
    if (n == 0) return;
    const int cd = conv_dim();
    const size_t lrow = tlog_row(), ng = tlog_g(), nb = tlog_b();
    dq_.resize((size_t)n * cd);
    dg_.resize((size_t)n * ng);
    db_.resize((size_t)n * nb);
    SlotRuns runs;
    runs.slot = {slot};
    runs.tok.resize((size_t)n);
    runs.off = {0, n};
    for (int k = 0; k < n; ++k) runs.tok[(size_t)k] = k;
    for (int l = c_.layer_begin; l < c_.layer_end; ++l) {
        if (!layers_[(size_t)l].recurrent) continue;
        const float *src = tlog_.data() + ((size_t)slot * n_rec_layers_ + rec_index_[(size_t)l]) * kReplayMax * lrow;
        for (int k = 0; k < n; ++k, src += lrow) {
            std::memcpy(dq_.data() + (size_t)k * cd, src, sizeof(float) * cd);
            std::memcpy(dg_.data() + (size_t)k * ng, src + cd, sizeof(float) * ng);
            std::memcpy(db_.data() + (size_t)k * nb, src + cd + ng, sizeof(float) * nb);
        }
        if (c_.shortconv) conv_runs(l, dq_.data(), false, runs);  // (the outputs are not needed)
        else if (c_.mamba2) mamba2_state(l, n, runs);
        else if (c_.mamba1) mamba1_state(l, n, runs);
        else deltanet_state(l, n, runs);
    }
    rpos_[(size_t)slot] = p0 + n;
}

void Engine::conv_runs(int layer, float *buf, bool silu_out, const SlotRuns &r) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int K = c_.ssm_conv, cd = conv_dim(), rl = rec_index_[(size_t)layer];
    const int threads = threads_ > 0 ? threads_ : ThreadPool::instance().size();
    const size_t csf = conv_state_floats();
    // per (run, block of 64 channels): each channel's tokens in order; no value's operation order
    // depends on the split
    const int64_t CB = kConvBlock, nblk = (cd + CB - 1) / CB, items = (int64_t)r.slot.size() * nblk;
    const int parts = (int)std::min<int64_t>(items, threads > 1 ? (int64_t)threads * 4 : 1);
    ThreadPool::instance().run(parts, [&](int i, int nth) {
        int64_t b, e;
        split_range(items, i, nth, &b, &e);
        // The block's state and taps transposed (tap j of channel c0 + i at [j][i]; the taps once
        // at load, LayerWeights::conv_wT), so the loops over channels are contiguous and
        // vectorise: each channel's sum is still 0 + s_0 w_0 + .. + s_{K-2} w_{K-2} + x w_{K-1}
        // (+ b), in that order (the same bits).
        thread_local std::vector<float> sT;
        sT.resize((size_t)std::max(K - 1, 1) * CB);
        float sum[CB];
        for (int64_t it = b; it < e; ++it) {
            const int run = (int)(it / nblk), c0 = (int)(it % nblk * CB), nc = std::min(cd, c0 + (int)CB) - c0;
            float *st = conv_st_.data() + ((size_t)r.slot[(size_t)run] * n_rec_layers_ + rl) * csf;
            const float *wT = L.conv_wT.data() + (size_t)(it % nblk) * K * CB;
            for (int i = 0; i < nc; ++i)
                for (int j = 0; j < K - 1; ++j) sT[(size_t)j * CB + i] = st[(size_t)(c0 + i) * (K - 1) + j];
            const float *bias = L.ssm_conv1d_b ? L.ssm_conv1d_b + c0 : nullptr;  // (Mamba-2: ggml_add after ggml_ssm_conv)
            for (int k = r.off[(size_t)run]; k < r.off[(size_t)run + 1]; ++k) {
                float *xt = buf + (size_t)r.tok[(size_t)k] * cd + c0;
                for (int i = 0; i < nc; ++i) sum[i] = 0.0f;
                for (int j = 0; j < K - 1; ++j) {
                    const float *sj = sT.data() + (size_t)j * CB, *wj = wT + (size_t)j * CB;
                    for (int i = 0; i < nc; ++i) sum[i] += sj[i] * wj[i];
                }
                const float *wl = wT + (size_t)(K - 1) * CB;
                for (int i = 0; i < nc; ++i) sum[i] += xt[i] * wl[i];
                if (bias)
                    for (int i = 0; i < nc; ++i) sum[i] += bias[i];
                for (int j = 0; j + 1 < K - 1; ++j)
                    std::memcpy(sT.data() + (size_t)j * CB, sT.data() + (size_t)(j + 1) * CB, sizeof(float) * nc);
                if (K > 1) std::memcpy(sT.data() + (size_t)(K - 2) * CB, xt, sizeof(float) * nc);
                if (silu_out)
                    for (int i = 0; i < nc; ++i) xt[i] = silu_f32(sum[i]);
                else
                    std::memcpy(xt, sum, sizeof(float) * nc);
            }
            for (int i = 0; i < nc; ++i)
                for (int j = 0; j < K - 1; ++j) st[(size_t)(c0 + i) * (K - 1) + j] = sT[(size_t)j * CB + i];
        }
    });
}

void Engine::deltanet_state(int layer, int T, const SlotRuns &runs) {
    const int S = c_.ssm_state, Hk = c_.ssm_groups, Hv = c_.ssm_heads;
    const int kdim = Hk * S, vd = Hv * S, cd = 2 * kdim + vd, r = Hv / Hk;
    const int rl = rec_index_[(size_t)layer];
    const int threads = threads_ > 0 ? threads_ : ThreadPool::instance().size();
    const int n_runs = (int)runs.slot.size();
    const size_t ssf = ssm_state_floats();

    // 2. conv1d + silu, in place on dq_; 3. then l2 norms of q and k
    conv_runs(layer, dq_.data(), true, runs);
    const float eps_s = c_.eps / (float)S, inv_sqrt_s = 1.0f / std::sqrt((float)S);
    for (int t = 0; t < T; ++t)
        for (int hh = 0; hh < 2 * Hk; ++hh) {  // q heads then k heads, contiguous
            float *v = dq_.data() + (size_t)t * cd + (size_t)hh * S;
            double ss = 0.0;
            for (int i = 0; i < S; ++i) ss += (double)(v[i] * v[i]);
            const float sc = 1.0f / std::sqrt((float)(ss / S) + eps_s);
            for (int i = 0; i < S; ++i) v[i] = (v[i] * sc) * inv_sqrt_s;
        }

    // 5. the delta rule per (run, value head), tokens in order; o into dout_[T][H_v][S]
    dout_.resize((size_t)T * vd);
    {
        const delta_fn delta = kernel_table().delta.fn;
        const int64_t items = (int64_t)n_runs * Hv;
        const int parts = (int)std::min<int64_t>(items, threads > 1 ? (int64_t)threads * 4 : 1);
        ThreadPool::instance().run(parts, [&](int i, int nth) {
            int64_t b, e;
            split_range(items, i, nth, &b, &e);
            for (int64_t it = b; it < e; ++it) {
                const int run = (int)(it / Hv), h = (int)(it % Hv);
                const int kh = c_.ssm_kv_interleave ? h / r : h % Hk;
                float *M = ssm_st_.data() + ((size_t)runs.slot[(size_t)run] * n_rec_layers_ + rl) * ssf + (size_t)h * S * S;
                for (int k = runs.off[(size_t)run]; k < runs.off[(size_t)run + 1]; ++k) {
                    const int t = runs.tok[(size_t)k];
                    const float *qt = dq_.data() + (size_t)t * cd + (size_t)kh * S;
                    const float *kt = qt + kdim;
                    const float *vt = dq_.data() + (size_t)t * cd + 2 * (size_t)kdim + (size_t)h * S;
                    const float decay = std::exp(dg_[(size_t)t * Hv + h]), beta = db_[(size_t)t * Hv + h];
                    delta(M, kt, qt, vt, decay, beta, inv_sqrt_s, dout_.data() + (size_t)t * vd + (size_t)h * S, S);
                }
            }
        });
    }

}

}  // namespace lowbit
