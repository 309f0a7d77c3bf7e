// Matrix x window of tokens through the row kernels: the one call every caller uses
// (the kernel API's matmul, the engine, the benchmarks), and its FFN variant with the GLU
// epilogue fused (gate and up rows in one pass, silu(gate) * up written out).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels.h"

namespace lowbit {

// out[t * out_stride + r] = dot(W[r], act[t]) for r in [r0, r1), t < nt, through entry e's
// GEMM (when its gate admits nt) or its row kernels in windows of <= 8 tokens (or 16: the wide
// window, next_window), rows split over `threads` pool threads.
// isa: the level whose table `e` is (for the call counters).
void run_rows(const Format &f, const KernelEntry &e, int isa, const uint8_t *w, size_t w_stride,
              const uint8_t *act, size_t act_stride, int64_t nt, float *out, size_t out_stride,
              int64_t n, float w_scale, int64_t r0, int64_t r1, int threads);

// One matrix of a run_rows_multi call: rows [r0, r1) of W (format *f, kernels *e, row r at
// w + r * w_stride) into out[t * out_stride + r].
struct RowJob {
    const Format *f = nullptr;
    const KernelEntry *e = nullptr;
    const uint8_t *w = nullptr;
    size_t w_stride = 0;
    float w_scale = 1.0f;  // per-tensor scale inside the row kernel (I2_S)
    float *out = nullptr;
    size_t out_stride = 0;
    int64_t r0 = 0, r1 = 0;
};

// run_rows over several matrices that read the same activations (act: nt rows of act_stride
// bytes, the one activation format all jobs pair with; n values each) in ONE pool dispatch:
// their rows are split over the threads as one range. Each (matrix, row, token) result is
// bitwise run_rows' on that matrix alone (same kernels, same windows, same tier; I2, I3, I8).
void run_rows_multi(const RowJob *jobs, int n_jobs, int isa, const uint8_t *act, size_t act_stride, int64_t nt,
                    int64_t n, int threads);

// One weight matrix as the fused GLU path sees it: row r at w + r * stride, raw bytes of
// format *f, run through *e's row kernels; y = (W x) * out_scale (one float multiply per
// output, as Engine::matmul applies Mat::out_scale; 1.0f: none).
struct RowMat {
    const Format *f = nullptr;
    const KernelEntry *e = nullptr;
    const uint8_t *w = nullptr;
    size_t stride = 0;
    float scale = 1.0f;      // per-tensor scale inside the row kernel (I2_S)
    float out_scale = 1.0f;
};

// The GLU's output quantized by the thread that made it, tile by tile, right after the
// epilogue (still in L1), into the next matmul's activation format: token t's values [tb, te)
// of a tile become its blocks tb / block .. te / block - 1 at dst + t * stride. Bitwise one
// quantization of the whole row afterwards, for formats whose blocks are quantized each from
// its own values alone (Q8_0, Q8_1, Q8_K: ActOut::blockwise). run_rows_glu then starts every
// part and tile of rows at a multiple of `block`. Without it the caller quantized the whole
// output alone while the other threads waited (4.9% of a 16-token serving step's samples, the
// values read back from the cores that wrote them).
struct ActOut {
    quant_act_fn fn = nullptr;
    int64_t block = 0;       // values per block
    size_t block_bytes = 0;  // bytes per block
    uint8_t *dst = nullptr;
    size_t stride = 0;       // bytes per token
    // token t's values [x0, x0 + n) (at v; x0 and n multiples of block) into their blocks
    void put(const float *v, int64_t t, int64_t x0, int64_t n) const {
        fn(v, dst + (size_t)t * stride + (size_t)(x0 / block) * block_bytes, n);
    }
    static bool blockwise(int act_format);
};

// out[t * out_stride + r] = glu(gate_t_r, up_t_r) (glu_fn contract in kernels.h, kind
// GLU_SILU or GLU_RELU2) for every row r < rows of gate and up and t < nt, where gate_t_r =
// dot(G[r], act[t]) * gate.out_scale and likewise for up. One pool dispatch: each thread
// takes its range of rows and, tile by tile, runs the gate and the up kernels of each
// 8-token window into a thread-local scratch, then the epilogue into out. Bitwise identical
// to run_rows(gate) + run_rows(up) + out_scale + glu over the whole array (the same kernels
// on the same windows; I2, I3; the epilogue is elementwise). gate and up share the
// activation format (act is one quantized copy of x; the caller checks), rows and n.
// q (optional): out also quantized where it is made (ActOut), for the down projection.
void run_rows_glu(const RowMat &gate, const RowMat &up, const GluKernel &glu, int kind, int isa,
                  const uint8_t *act, size_t act_stride, int64_t nt, float *out, size_t out_stride, int64_t n,
                  int64_t rows, int threads, const ActOut *q = nullptr);

// The per-thread body of run_rows_glu, also the MoE expert pool's: rows [rb, re) of gate
// (against act_g) and up (against act_u), nt tokens, in tiles of `tile` rows (scratch:
// thread-local). Writes out[t * out_stride + r] for r in [rb, re) only. No counting.
// bias_g / bias_u (optional, indexed by row): added to gate / up after out_scale, before the
// epilogue (gpt-oss's expert biases). gate.w null: an ungated FFN (nemotron_h's experts), out =
// relu(up)^2 (gate.e, gate.stride: up's, for the tiling and the GEMM choice). q (optional):
// as run_rows_glu's (rb, re and tile then multiples of q->block).
void glu_rows(const RowMat &gate, const uint8_t *act_g, size_t act_g_stride, const RowMat &up,
              const uint8_t *act_u, size_t act_u_stride, int64_t nt, int64_t n, glu_fn glu, int kind,
              int64_t rb, int64_t re, int64_t tile, float *out, size_t out_stride,
              const float *bias_g = nullptr, const float *bias_u = nullptr, uint64_t act_id = 0,
              const ActOut *q = nullptr);

// A fresh RowArgs::act_id (never 0): one per matmul call whose activations stay unchanged for
// the call.
uint64_t new_act_id();
// Rows per tile of glu_rows for a chunk of nt tokens: one window (or the GEMM): a fixed count;
// several windows: kTileBytes of gate + up weight rows, so they stay in L2 while every window
// reads them.
int64_t glu_tile_rows(const RowMat &gate, const RowMat &up, int64_t nt);

}  // namespace lowbit
