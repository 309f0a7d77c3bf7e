// The Mamba-1 mixer (llama.cpp's mamba: src/models/mamba-base.cpp build_mamba_layer, ggml's
// GGML_OP_SSM_CONV and the Mamba-1 branch of GGML_OP_SSM_SCAN). Shapes, with d_inner = ssm_inner,
// N = ssm_state, R = ssm_dt_rank, K = ssm_conv:
//
//   1. xz[T][2 d_inner] = ssm_in . x: x [d_inner] (the conv's input), then z [d_inner].
//   2. per token, in order, per channel: the causal depthwise conv over the last K inputs plus
//      ssm_conv1d.bias, then silu (Engine::conv_runs, shared with Mamba-2, the delta-net, LFM2).
//   3. x_db[T][R + 2 N] = ssm_x . x_conv: dt_in [R], B [N], C [N]; with ssm_dt_b_c_rms (Falcon-Mamba)
//      each RMS-normed without a weight (Jamba: with ssm_dt_norm / ssm_b_norm / ssm_c_norm, times each) (ggml's rms_norm: squares summed in double); then
//      dt[d_inner] = ssm_dt . dt_in + ssm_dt.bias, and dt_i = softplus(dt_i) (ggml's).
//   4. the scan per (slot, channel i), tokens in order, on the state s[i][N] (ggml's Mamba-1 loop):
//      s_j = (s_j * expf(dt_i * A[i][j])) + (B_j * (x_i dt_i)); y_i = sum_j s_j C_j in j order.
//   5. y_i = (y_i + x_i * D_i) * silu(z_i); out = ssm_out . y.
//
// Every channel has its own decay per state element (Mamba-2's is one scalar per head), so the
// scan is this file's scalar loop, not the scan kernel slot: it streams d_inner x N floats of state
// per token (Falcon-Mamba-7B: 8192 x 16, 512 KB a layer) with an expf per element, the same at
// every level. As the other recurrent mixers: prefill runs the decode's token loop (a token's
// arithmetic never depends on its window, I8), and the replay log keeps the conv input row, dt and
// B | C per token (what steps 2 and 4 consume) for a bitwise rewind (Engine::rstate_replay).
#include <cmath>
#include <cstring>

#include "engine.h"
#include "kernels.h"
#include "threadpool.h"

namespace lowbit {

// ggml's rms_norm without a weight over n values, in place
static void rms_plain(float *v, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; ++i) ss += (double)(v[i] * v[i]);
    const float s = 1.0f / std::sqrt((float)(ss / n) + eps);
    for (int i = 0; i < n; ++i) v[i] = v[i] * s;
}

void Engine::mamba1(int layer, const float *x, int T, const int32_t *slots, float *out) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int di = c_.ssm_inner, N = c_.ssm_state, R = c_.ssm_dt_rank;

    // 1. the input projection; the conv's input rows into dq_ (kept in dz_ for the replay log)
    dab_.resize((size_t)T * 2 * di);
    matmul(L.ssm_in, x, T, dab_.data());
    dq_.resize((size_t)T * di);
    dz_.resize((size_t)T * di);
    for (int t = 0; t < T; ++t) std::memcpy(dq_.data() + (size_t)t * di, dab_.data() + (size_t)t * 2 * di, sizeof(float) * di);
    std::memcpy(dz_.data(), dq_.data(), sizeof(float) * (size_t)T * di);
    const SlotRuns runs = slot_runs(slots, T, c_.n_slots);
    conv_runs(layer, dq_.data(), true, runs);  // 2. in place: dq_ = silu(conv(x) + bias)

    // 3. dt, B, C: db_[t] = [B | C], dg_[t] = softplus(dt)
    std::vector<float> &xdb = dout_;  // (scratch until the scan writes y there)
    xdb.resize((size_t)T * (R + 2 * N));
    matmul(L.ssm_x, dq_.data(), T, xdb.data());
    std::vector<float> dtin((size_t)T * R);
    db_.resize((size_t)T * 2 * N);
    for (int t = 0; t < T; ++t) {
        float *row = xdb.data() + (size_t)t * (R + 2 * N);
        if (c_.ssm_dt_b_c_rms || L.ssm_dt_norm) {  // (Jamba: each then times its weight, ggml_mul)
            rms_plain(row, R, c_.eps);
            rms_plain(row + R, N, c_.eps);
            rms_plain(row + R + N, N, c_.eps);
            if (L.ssm_dt_norm) {
                for (int i = 0; i < R; ++i) row[i] *= L.ssm_dt_norm[i];
                for (int i = 0; i < N; ++i) row[R + i] *= L.ssm_b_norm[i], row[R + N + i] *= L.ssm_c_norm[i];
            }
        }
        std::memcpy(dtin.data() + (size_t)t * R, row, sizeof(float) * R);
        std::memcpy(db_.data() + (size_t)t * 2 * N, row + R, sizeof(float) * 2 * N);
    }
    dg_.resize((size_t)T * di);
    matmul(L.ssm_dtw, dtin.data(), T, dg_.data());
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < di; ++i) {
            float &d = dg_[(size_t)t * di + i];
            d = softplus_f32(d + L.ssm_dt[i]);
        }
    tlog_write(layer, runs, [&](size_t t, float *dst) {  // the replay log: what the state update takes
        std::memcpy(dst, dz_.data() + t * di, sizeof(float) * di);
        std::memcpy(dst + di, dg_.data() + t * di, sizeof(float) * di);
        std::memcpy(dst + 2 * (size_t)di, db_.data() + t * 2 * N, sizeof(float) * 2 * N);
    });
    dout_.resize((size_t)T * di);
    mamba1_scan(layer, T, runs);  // 4. y into dout_

    // 5. the skip and the gate, then the output projection
    for (int t = 0; t < T; ++t) {
        float *y = dout_.data() + (size_t)t * di;
        const float *xc = dq_.data() + (size_t)t * di;
        const float *z = dab_.data() + (size_t)t * 2 * di + di;
        for (int i = 0; i < di; ++i) y[i] = silu_f32(z[i]) * (y[i] + xc[i] * L.ssm_d[i]);
    }
    matmul(L.ssm_out, dout_.data(), T, out);
}

void Engine::mamba1_state(int layer, int T, const SlotRuns &runs) {
    conv_runs(layer, dq_.data(), true, runs);  // 2. in place on dq_ (the logged conv inputs)
    dout_.resize((size_t)T * c_.ssm_inner);
    mamba1_scan(layer, T, runs);
}

void Engine::mamba1_scan(int layer, int T, const SlotRuns &runs) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int di = c_.ssm_inner, N = c_.ssm_state;
    const int rl = rec_index_[(size_t)layer];
    const int threads = threads_ > 0 ? threads_ : ThreadPool::instance().size();
    const size_t ssf = ssm_state_floats();
    constexpr int CB = 64;  // channels per work item
    const int nblk = (di + CB - 1) / CB;
    const int64_t items = (int64_t)runs.slot.size() * nblk;
    const int parts = (int)std::min<int64_t>(items, threads > 1 ? (int64_t)threads * 4 : 1);
    ThreadPool::instance().run(parts, [&](int p, int nth) {  // per (run, channel block), tokens in order
        int64_t b, e;
        split_range(items, p, nth, &b, &e);
        for (int64_t it = b; it < e; ++it) {
            const int run = (int)(it / nblk), i0 = (int)(it % nblk) * CB, i1 = std::min(di, i0 + CB);
            float *S = ssm_st_.data() + ((size_t)runs.slot[(size_t)run] * n_rec_layers_ + rl) * ssf;
            for (int k = runs.off[(size_t)run]; k < runs.off[(size_t)run + 1]; ++k) {
                const int t = runs.tok[(size_t)k];
                const float *xc = dq_.data() + (size_t)t * di, *dt = dg_.data() + (size_t)t * di;
                const float *B = db_.data() + (size_t)t * 2 * N, *C = B + N;
                float *y = dout_.data() + (size_t)t * di;
                for (int i = i0; i < i1; ++i) {
                    float *s = S + (size_t)i * N;
                    const float *A = L.ssm_a + (size_t)i * N;
                    const float x_dt = xc[i] * dt[i];
                    float sum = 0.0f;
                    for (int j = 0; j < N; ++j) {
                        const float st = (s[j] * std::exp(dt[i] * A[j])) + (B[j] * x_dt);
                        sum += st * C[j];
                        s[j] = st;
                    }
                    y[i] = sum;
                }
            }
        }
    });
}

}  // namespace lowbit
