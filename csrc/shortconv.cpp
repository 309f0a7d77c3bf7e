// LFM2's short-conv block (llama.cpp's lfm2 / lfm2moe: src/models/lfm2.cpp, build_shortconv_block),
// the recurrent layers of an EngineConfig::shortconv model. Per token, from the normed input x[dim]:
//
//   1. bcx[3 dim] = shortconv.in_proj . x, three consecutive dim-wide chunks b, c, x';
//   2. u = b * x' (elementwise, ggml_mul);
//   3. per channel, the causal depthwise conv over the last K inputs u: K-1 from the slot's conv
//      state (oldest first), then this token's; the sum in tap order (ggml_ssm_conv), no
//      activation. Engine::conv_runs, shared with the delta-net (csrc/deltanet.cpp);
//   4. y = c * conv(u); out = shortconv.out_proj . y.
//
// A slot's state is the last K-1 inputs u per channel (K = shortconv.l_cache, 3 in every LFM2).
// Tokens of a slot run in order and a token's arithmetic never depends on the window it arrived
// in (I8), so the replay log keeps the u rows and a rewind replays them bitwise (rstate_replay).
#include <cstring>

#include "engine.h"

namespace lowbit {

void Engine::shortconv(int layer, const float *x, int T, const int32_t *slots, float *out) {
    const LayerWeights &L = layers_[(size_t)layer];
    const size_t D = (size_t)c_.dim;
    dab_.resize((size_t)T * 3 * D);  // bcx [T][b | c | x']
    dq_.resize((size_t)T * D);       // u, then y
    matmul(L.sc_in, x, T, dab_.data());
    for (size_t t = 0; t < (size_t)T; ++t) {
        const float *bcx = dab_.data() + t * 3 * D;
        for (size_t i = 0; i < D; ++i) dq_[t * D + i] = bcx[i] * bcx[2 * D + i];
    }
    const SlotRuns runs = slot_runs(slots, T, c_.n_slots);
    tlog_write(layer, runs, [&](size_t t, float *dst) { std::memcpy(dst, dq_.data() + t * D, sizeof(float) * D); });
    conv_runs(layer, dq_.data(), false, runs);
    for (size_t t = 0; t < (size_t)T; ++t) {
        const float *c = dab_.data() + t * 3 * D + D;
        for (size_t i = 0; i < D; ++i) dq_[t * D + i] = c[i] * dq_[t * D + i];
    }
    matmul(L.sc_out, dq_.data(), T, out);
}

}  // namespace lowbit
