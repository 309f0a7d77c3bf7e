// Benchmark loops, in C++ so that Python overhead never enters a timing.
//
// bench_rows: lowbit's row kernels over all rows of a matrix for a window of nt tokens.
// bench_vec_dot: ggml's vec_dot (a function pointer the caller got by dlopen'ing the
//   llama-cpp-python wheel's libggml-cpu.so) called row by row and token by token, the way
//   ggml's mul_mat calls it, over the same rows, split over the same thread pool.
// bench_quant_act / bench_from_float: one activation quantizer, lowbit's or ggml's from_float
//   (same pointer-typed signature: x, dst, n), over rows of the same input on the calling
//   thread, the way the engine quantizes a layer's input once per token.
// membw: read bandwidth of this machine (sum of a large buffer), the ceiling of decode.
// Each returns the median wall time of `reps` runs in seconds, after one warm-up run.
#include "bench.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <stdexcept>
#include <string>
#include <vector>

#include "dispatch.h"
#include "x86/prefetch.h"  // kPrefetchAhead; _mm_prefetch is SSE, baseline x86-64
#include "matmul.h"
#include "threadpool.h"

namespace lowbit {

static bool g_thread_clock = false;
void set_bench_thread_clock(bool on) { g_thread_clock = on; }

static double clock_seconds() {
    timespec ts;
    clock_gettime(g_thread_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

template <class F>
static double median_time(int reps, F &&body) {
    body();  // warm-up: page in, train the branch predictors
    std::vector<double> ts;
    for (int i = 0; i < reps; ++i) {
        const double t0 = clock_seconds();
        body();
        ts.push_back(clock_seconds() - t0);
    }
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

double bench_rows(const KernelEntry &e, const RowArgs &a, int64_t rows, int nt, int threads, int reps) {
    const RowKernel &k = e.rows[nt];
    if (!k.fn) return -1.0;
    ThreadPool &pool = ThreadPool::instance();
    return median_time(reps, [&] {
        pool.run(threads, [&](int i, int nth) {
            int64_t b, en;
            split_range(rows, i, nth, &b, &en);
            if (en > b) k.fn(a, b, en, nt);
        });
    });
}

// matmul's own path (run_rows: row tiles, windows of 8 or the GEMM) over all rows, nt tokens.
double bench_matmul(const Format &f, const KernelEntry &e, int isa, const uint8_t *w, size_t w_stride,
                    const uint8_t *act, size_t act_stride, int64_t nt, float *out, int64_t n, float w_scale,
                    int64_t rows, int threads, int reps) {
    return median_time(reps, [&] {
        run_rows(f, e, isa, w, w_stride, act, act_stride, nt, out, (size_t)rows, n, w_scale, 0, rows, threads);
    });
}

using ggml_vec_dot_t = void (*)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y,
                                size_t by, int nrc);

double bench_vec_dot(uintptr_t fn_addr, const uint8_t *w, size_t w_stride, const uint8_t *act,
                     size_t act_stride, float *out, int64_t rows, int64_t n, int nt, int threads, int reps) {
    const auto fn = reinterpret_cast<ggml_vec_dot_t>(fn_addr);
    ThreadPool &pool = ThreadPool::instance();
    return median_time(reps, [&] {
        pool.run(threads, [&](int i, int nth) {
            int64_t b, en;
            split_range(rows, i, nth, &b, &en);
            // ggml's mul_mat order for one weight block of rows: tokens outer, rows inner
            for (int t = 0; t < nt; ++t)
                for (int64_t r = b; r < en; ++r)
                    fn((int)n, out + (size_t)t * rows + r, 0, w + (size_t)r * w_stride, 0,
                       act + (size_t)t * act_stride, 0, 1);
        });
    });
}

// One quantizer (lowbit's or ggml's: both take x, dst, n) over the rows, on this thread.
template <class Fn>
static double time_quant_rows(Fn fn, const float *x, uint8_t *dst, int64_t rows, int64_t n, size_t row_bytes,
                              int reps) {
    return median_time(reps, [&] {
        for (int64_t r = 0; r < rows; ++r) fn(x + (size_t)r * n, dst + (size_t)r * row_bytes, n);
    });
}

double bench_quant_act(quant_act_fn fn, const float *x, uint8_t *dst, int64_t rows, int64_t n, size_t row_bytes,
                       int reps) {
    return time_quant_rows(fn, x, dst, rows, n, row_bytes, reps);
}

using ggml_from_float_t = void (*)(const float *x, void *y, int64_t k);

double bench_from_float(uintptr_t fn_addr, const float *x, uint8_t *dst, int64_t rows, int64_t n, size_t row_bytes,
                        int reps) {
    return time_quant_rows(reinterpret_cast<ggml_from_float_t>(fn_addr), x, dst, rows, n, row_bytes, reps);
}

double membw(const uint8_t *buf, size_t bytes, int threads, int reps, bool prefetch, uint64_t *sink) {
    ThreadPool &pool = ThreadPool::instance();
    std::vector<uint64_t> part((size_t)threads * 8, 0);
    const double t = median_time(reps, [&] {
        pool.run(threads, [&](int i, int nth) {
            int64_t b, en;
            split_range((int64_t)(bytes / 64), i, nth, &b, &en);
            const uint64_t *p = reinterpret_cast<const uint64_t *>(buf);
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (int64_t c = b; c < en; ++c) {  // one 64-byte line per step
                const uint64_t *q = p + c * 8;
                if (prefetch) prefetch_ahead(q, 64);
                s0 += q[0] ^ q[4]; s1 += q[1] ^ q[5]; s2 += q[2] ^ q[6]; s3 += q[3] ^ q[7];
            }
            part[(size_t)i * 8] += s0 + s1 + s2 + s3;
        });
    });
    uint64_t s = 0;
    for (uint64_t v : part) s += v;
    *sink = s;
    return t;
}

#if defined(__x86_64__) || defined(_M_X64)
namespace avx2 {
uint64_t peak_int8(int64_t, uint64_t *);
uint64_t peak_f32(int64_t, uint64_t *);
uint64_t peak_int8_i16(int64_t, uint64_t *);
}
namespace avx2vnni { uint64_t peak_int8(int64_t, uint64_t *); uint64_t peak_f32(int64_t, uint64_t *); }
namespace avx512 { uint64_t peak_int8(int64_t, uint64_t *); uint64_t peak_f32(int64_t, uint64_t *); }
#if defined(LOWBIT_HAVE_AMX)
namespace amx { uint64_t peak_int8(int64_t, uint64_t *); uint64_t peak_bf16(int64_t, uint64_t *); }  // tiles (amx/peak.cpp)
#endif
#endif

double bench_peak(int isa, int kind, int64_t iters, int threads, int reps, uint64_t *macs) {
    using Fn = uint64_t (*)(int64_t, uint64_t *);
    Fn fn = nullptr;
#if defined(__x86_64__) || defined(_M_X64)
    if (isa == ISA_AVX2) fn = kind == 2 ? &avx2::peak_int8_i16 : kind ? &avx2::peak_f32 : &avx2::peak_int8;
    if (kind == 2 && isa != ISA_AVX2)
        throw std::invalid_argument(std::string("bench peak: int16 sums are avx2's loop, not level ") + isa_name(isa));
    if (kind == 3 && (isa != ISA_AMX || !cpu_info().amx_bf16 || cpu_info().amx_emulated))
        throw std::invalid_argument("bench peak: bf16 tiles are the amx level's loop where the CPU has AMX-BF16");
    if (isa == ISA_AVX2VNNI) fn = kind ? &avx2vnni::peak_f32 : &avx2vnni::peak_int8;
    if (isa == ISA_AVX512) fn = kind ? &avx512::peak_f32 : &avx512::peak_int8;
    // amx: the tiles' int8 loop (its rounds are 4 tile products, not vector chains), avx512's f32;
    // none where the level is emulated (LOWBIT_AMX=emulate: the emulator's speed means nothing)
#if defined(LOWBIT_HAVE_AMX)
    if (isa == ISA_AMX && !cpu_info().amx_emulated) fn = kind == 3 ? &amx::peak_bf16 : kind ? &avx512::peak_f32 : &amx::peak_int8;
#endif
    if (isa == ISA_AMX && cpu_info().amx_emulated)
        throw std::invalid_argument("bench peak: the amx level is emulated here (LOWBIT_AMX=emulate): no peak to measure");
#endif
    if (!fn) throw std::invalid_argument(std::string("bench peak has no loops for the level ") + isa_name(isa));
    std::vector<uint64_t> done((size_t)threads * 8, 0), sink((size_t)threads * 8, 0);
    ThreadPool &pool = ThreadPool::instance();
    const double t = median_time(reps, [&] {
        pool.run(threads, [&](int i, int) { done[(size_t)i * 8] = fn(iters, &sink[(size_t)i * 8]); });
    });
    uint64_t m = 0;
    for (int i = 0; i < threads; ++i) m += done[(size_t)i * 8];
    *macs = m;
    return t;
}

}  // namespace lowbit
