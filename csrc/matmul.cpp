#include "matmul.h"

#include <stdexcept>
#include <string>

#include "threadpool.h"

namespace lowbit {

void run_rows(const Format &f, const KernelEntry &e, int isa, const uint8_t *w, size_t w_stride,
              const uint8_t *act, size_t act_stride, int64_t nt, float *out, size_t out_stride,
              int64_t n, float w_scale, int64_t r0, int64_t r1, int threads) {
    for (int64_t t0 = 0; t0 < nt; t0 += MAX_NT) {
        const int ntc = (int)((nt - t0) < MAX_NT ? (nt - t0) : MAX_NT);
        const RowKernel &k = e.rows[ntc];
        if (!k.fn) throw std::invalid_argument(std::string("no row kernel for ") + f.name);
        RowArgs a{w, w_stride, act + (size_t)t0 * act_stride, act_stride,
                  out + (size_t)t0 * out_stride, out_stride, n, w_scale};
        const int64_t rows = r1 - r0;
        int nth = threads;
        if (nth > rows) nth = (int)(rows > 0 ? rows : 1);
        count_call(f.id, ntc, isa, rows);
        ThreadPool::instance().run(nth, [&](int i, int nthr) {
            int64_t b, en;
            split_range(rows, i, nthr, &b, &en);
            if (en > b) k.fn(a, r0 + b, r0 + en, ntc);
        });
    }
}

}  // namespace lowbit
