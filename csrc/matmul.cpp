#include "matmul.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "threadpool.h"

namespace lowbit {

// One pool dispatch per call, whatever the window count: each thread takes its row range and,
// tile by tile (~32 KB of weight rows, so they stay in L1/L2 while every window of tokens
// reads them), runs each window's kernel over the tile. A (row, token) pair is computed by
// the same kernel on the same bytes as with one dispatch per window (windows are cut the same
// way: tokens t0..t0+7), so results are bitwise unchanged (I2, I3); a prompt chunk pays one
// barrier instead of one per 8 tokens, and streams each weight row from memory once.
void run_rows(const Format &f, const KernelEntry &e, int isa, const uint8_t *w, size_t w_stride,
              const uint8_t *act, size_t act_stride, int64_t nt, float *out, size_t out_stride,
              int64_t n, float w_scale, int64_t r0, int64_t r1, int threads) {
    const int64_t rows = r1 - r0;
    const int64_t windows = (nt + MAX_NT - 1) / MAX_NT;
    // The entry's GEMM, when it has one and the chunk is long enough, takes all nt tokens of a
    // tile in one call (same tiles, same per-token results: KernelEntry::gemm).
    const bool gemm = e.gemm.fn && e.gemm_min_nt > 0 && nt >= e.gemm_min_nt;
    if (gemm) count_call(f.id, 0, isa, rows);
    for (int64_t t0 = 0; t0 < nt && !gemm; t0 += MAX_NT) {
        const int ntc = (int)((nt - t0) < MAX_NT ? (nt - t0) : MAX_NT);
        if (!e.rows[ntc].fn) throw std::invalid_argument(std::string("no row kernel for ") + f.name);
        count_call(f.id, ntc, isa, rows);
    }
    const int64_t tile = windows > 1 ? (w_stride >= 32768 ? 1 : (int64_t)(32768 / w_stride)) : rows;
    // Parts, not threads: up to 4 per thread (of >= 16 rows), claimed dynamically by the pool,
    // so a thread descheduled by another process delays at most one small part.
    int64_t parts = threads > 1 ? std::min<int64_t>((int64_t)threads * 4, rows / 16) : 1;
    if (parts < threads) parts = std::min<int64_t>(threads, rows);
    if (parts < 1) parts = 1;
    ThreadPool::instance().run((int)parts, [&](int i, int nthr) {
        int64_t b, en;
        split_range(rows, i, nthr, &b, &en);
        for (int64_t tb = b; tb < en; tb += tile) {
            const int64_t te = tb + tile < en ? tb + tile : en;
            if (gemm) {
                e.gemm.fn(RowArgs{w, w_stride, act, act_stride, out, out_stride, n, w_scale}, r0 + tb, r0 + te, (int)nt);
                continue;
            }
            for (int64_t t0 = 0; t0 < nt; t0 += MAX_NT) {
                const int ntc = (int)((nt - t0) < MAX_NT ? (nt - t0) : MAX_NT);
                RowArgs a{w, w_stride, act + (size_t)t0 * act_stride, act_stride,
                          out + (size_t)t0 * out_stride, out_stride, n, w_scale};
                e.rows[ntc].fn(a, r0 + tb, r0 + te, ntc);
            }
        }
    });
}

}  // namespace lowbit
