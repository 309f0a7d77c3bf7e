// The Mamba-2 mixer of granitehybrid's, nemotron_h's, mamba2's and falcon-h1's SSM layers (llama.cpp's granitehybrid:
// src/models/mamba-base.cpp build_mamba2_layer, ggml's GGML_OP_SSM_CONV and GGML_OP_SSM_SCAN).
// Shapes, with N = ssm_state (d_state), G = ssm_groups, H = ssm_heads, d_inner = ssm_inner,
// P = d_inner / H (a head's channels), K = ssm_conv, conv_dim = d_inner + 2 G N:
//
//   1. zxBCdt[T][2 d_inner + 2 G N + H] = ssm_in . x (one matmul): z [d_inner], then x [d_inner],
//      B [G][N], C [G][N] (together the conv's input, xBC [conv_dim]), then dt [H].
//   2. per token, in order, per channel of xBC: the causal depthwise conv over the last K inputs
//      (K-1 from the slot's conv state, oldest first, then this token's), sum in tap order, plus
//      ssm_conv1d.bias, then silu (Engine::conv_runs, shared with the delta-net and LFM2).
//   3. per head h: dt_h = softplus(dt[h] + ssm_dt.bias[h]) (ggml's: x > 20 ? x : logf(1 + expf(x))),
//      dA = expf(dt_h * A[h]) (A = ssm_a = -exp(A_log), as the converter stores it); head h reads
//      B and C of group h / (H / G) (ggml's repeat_interleave).
//   4. the scan per (slot, head), tokens in order, on the state s[P][N] (kernel_table().scan:
//      s = s * dA + B * (x dt_h); y = s . C per channel).
//   5. y += x * D[h]; y *= silu(z); an RMSNorm over each of the G groups of d_inner / G channels
//      times ssm_norm (if the layer has one: falcon-h1's is optional); then out = ssm_out . y.
//
// As the delta-net (csrc/deltanet.cpp): prefill runs the decode's token loop (llama.cpp's CPU
// path does too), so a token's arithmetic never depends on the window it arrived in (I8); the
// replay log keeps what steps 2-4 consume (the conv input row, dt_h and dA per head) and a rewind
// replays it bitwise (Engine::rstate_replay).
#include <cmath>
#include <cstring>

#include "engine.h"
#include "kernels.h"
#include "threadpool.h"

namespace lowbit {

void Engine::mamba2(int layer, const float *x, int T, const int32_t *slots, float *out) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int H = c_.ssm_heads, di = c_.ssm_inner, cd = conv_dim(), G = c_.ssm_groups, P = di / H;
    const size_t rows = (size_t)di + cd + H;

    // 1. the input projection; the conv's input rows into dq_
    dab_.resize((size_t)T * rows);
    matmul(L.ssm_in, x, T, dab_.data());
    dq_.resize((size_t)T * cd);
    dg_.resize((size_t)T * H);
    db_.resize((size_t)T * H);
    for (int t = 0; t < T; ++t) {
        const float *zxbcdt = dab_.data() + (size_t)t * rows;
        std::memcpy(dq_.data() + (size_t)t * cd, zxbcdt + di, sizeof(float) * cd);
        // 3. the step and the decay per head: dg_ = dt_h, db_ = dA
        for (int h = 0; h < H; ++h) {
            const float a = zxbcdt[(size_t)di + cd + h] + L.ssm_dt[h];
            const float sp = softplus_f32(a);
            dg_[(size_t)t * H + h] = sp;
            db_[(size_t)t * H + h] = std::exp(sp * L.ssm_a[h]);
        }
    }
    const SlotRuns runs = slot_runs(slots, T, c_.n_slots);
    tlog_write(layer, runs, [&](size_t t, float *dst) {  // the replay log: what the state update takes
        std::memcpy(dst, dq_.data() + t * cd, sizeof(float) * cd);
        std::memcpy(dst + cd, dg_.data() + t * H, sizeof(float) * H);
        std::memcpy(dst + cd + H, db_.data() + t * H, sizeof(float) * H);
    });
    mamba2_state(layer, T, runs);  // 2 and 4: y into dout_

    // 5. the skip, the gate and the grouped RMSNorm, then the output projection
    const int gw = di / G;
    for (int t = 0; t < T; ++t) {
        float *y = dout_.data() + (size_t)t * di;
        const float *xc = dq_.data() + (size_t)t * cd;          // x after the conv
        const float *z = dab_.data() + (size_t)t * rows;
        for (int i = 0; i < di; ++i) y[i] = silu_f32(z[i]) * (y[i] + xc[i] * L.ssm_d[i / P]);
        for (int g = 0; L.ssm_norm && g < G; ++g) {  // (falcon-h1's may have none)
            float *v = y + (size_t)g * gw;
            double ss = 0.0;
            for (int i = 0; i < gw; ++i) ss += (double)(v[i] * v[i]);
            const float sc = 1.0f / std::sqrt((float)(ss / gw) + c_.eps);
            for (int i = 0; i < gw; ++i) v[i] = (v[i] * sc) * L.ssm_norm[(size_t)g * gw + i];
        }
    }
    matmul(L.ssm_out, dout_.data(), T, out);
}

void Engine::mamba2_state(int layer, int T, const SlotRuns &runs) {
    const int H = c_.ssm_heads, di = c_.ssm_inner, cd = conv_dim(), G = c_.ssm_groups, N = c_.ssm_state;
    const int P = di / H, hpg = H / G;
    const int rl = rec_index_[(size_t)layer];
    const int threads = threads_ > 0 ? threads_ : ThreadPool::instance().size();
    const size_t ssf = ssm_state_floats();

    conv_runs(layer, dq_.data(), true, runs);  // 2. in place on dq_
    dout_.resize((size_t)T * di);
    const scan_fn scan = kernel_table().scan.fn;
    const int64_t items = (int64_t)runs.slot.size() * H;
    const int parts = (int)std::min<int64_t>(items, threads > 1 ? (int64_t)threads * 4 : 1);
    ThreadPool::instance().run(parts, [&](int i, int nth) {  // 4. per (run, head), tokens in order
        int64_t b, e;
        split_range(items, i, nth, &b, &e);
        for (int64_t it = b; it < e; ++it) {
            const int run = (int)(it / H), h = (int)(it % H), g = h / hpg;
            float *s = ssm_st_.data() + ((size_t)runs.slot[(size_t)run] * n_rec_layers_ + rl) * ssf + (size_t)h * P * N;
            for (int k = runs.off[(size_t)run]; k < runs.off[(size_t)run + 1]; ++k) {
                const int t = runs.tok[(size_t)k];
                const float *xbc = dq_.data() + (size_t)t * cd;
                const float *B = xbc + di + (size_t)g * N, *C = xbc + di + (size_t)G * N + (size_t)g * N;
                scan(s, B, C, xbc + (size_t)h * P, dg_[(size_t)t * H + h], db_[(size_t)t * H + h],
                     dout_.data() + (size_t)t * di + (size_t)h * P, P, N);
            }
        }
    });
}

}  // namespace lowbit
