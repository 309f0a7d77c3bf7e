// The quantizer table (type id -> row quantizer) and the threaded driver.
#include "quant.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>

#include "../formats.h"
#include "../kernels.h"
#include "../threadpool.h"
#include "common.h"

namespace lowbit::quant {

namespace {

struct Entry {
    int id;
    row_fn fn;
    bool uses_imatrix;
};

constexpr Entry kTable[] = {
    {T_F32, row_f32, false},     {T_F16, row_f16, false},     {T_BF16, row_bf16, false},
    {T_Q4_0, row_q4_0, true},    {T_Q4_1, row_q4_1, true},    {T_Q5_0, row_q5_0, true},
    {T_Q5_1, row_q5_1, true},    {T_Q8_0, row_q8_0, false},   {T_Q2_K, row_q2_k, true},
    {T_Q3_K, row_q3_k, true},    {T_Q4_K, row_q4_k, true},    {T_Q5_K, row_q5_k, true},
    {T_Q6_K, row_q6_k, true},    {T_IQ4_NL, row_iq4_nl, true}, {T_IQ4_XS, row_iq4_xs, true},
    {T_TQ1_0, row_tq1_0, false}, {T_TQ2_0, row_tq2_0, false},
    {T_IQ2_XXS, row_iq2_xxs, true}, {T_IQ2_XS, row_iq2_xs, true}, {T_IQ2_S, row_iq2_s, true},
    {T_IQ3_XXS, row_iq3_xxs, true}, {T_IQ3_S, row_iq3_s, true},   {T_IQ1_S, row_iq1_s, true},
    {T_IQ1_M, row_iq1_m, true},
};

const Entry *entry(int id) {
    for (const Entry &e : kTable)
        if (e.id == id) return &e;
    return nullptr;
}

}  // namespace

// (I2_S and MXFP4: the quantizer their format table entry carries, csrc/ref/)
bool has_quantizer(int id) { return id == T_I2_S || id == T_MXFP4 || entry(id) != nullptr; }

// exactly ggml_quantize_requires_imatrix: IQ1_M runs without one (x^2 weights), although
// llama-quantize asks for one for it (src/lowbit/quantize.py's REQUIRES_IMATRIX)
bool needs_imatrix(int id) { return id == T_IQ2_XXS || id == T_IQ2_XS || id == T_IQ1_S; }

bool uses_imatrix(int id) {
    const Entry *e = entry(id);
    return e && e->uses_imatrix;
}

void quantize_rows(int id, const float *x, uint8_t *dst, int64_t rows, int64_t n, const float *imatrix,
                   int threads) {
    const Format *f = format_by_id(id);
    if (!f) throw std::invalid_argument("quantize: unknown format id " + std::to_string(id));
    if (n <= 0 || n % f->block) {
        throw std::invalid_argument(std::string("quantize: a row of ") + std::to_string(n) + " values is not a whole number of " +
                                    f->name + " blocks of " + std::to_string(f->block));
    }
    if (needs_imatrix(id) && !imatrix)
        throw std::invalid_argument(std::string("quantize: ") + f->name + " needs an importance matrix");
    if (id == T_I2_S || id == T_MXFP4) {  // I2_S: one scale for the whole tensor (csrc/ref/ternary.cpp),
        kernel_entry(id).quant_w(x, dst, rows, n);  // not split by rows; MXFP4: csrc/ref/mxfp4.cpp (no imatrix)
        return;
    }
    const Entry *e = entry(id);
    if (!e) throw std::invalid_argument(std::string("lowbit has no quantizer for ") + f->name);
    const size_t rb = row_bytes(f, n);
    const float *qw = e->uses_imatrix ? imatrix : nullptr;
    ThreadPool &pool = ThreadPool::instance();
    const int nth = threads > 0 ? threads : pool.size();
    // a few parts per thread so a descheduled worker's share is taken by the others
    const int parts = (int)std::min<int64_t>(rows, (int64_t)nth * 4);
    // A row function may throw (the grid i-quants, on a row ggml aborts on): the first failing
    // row (lowest index) is reported after every part has finished; exceptions never cross
    // the pool's threads.
    std::mutex mu;
    int64_t bad_row = -1;
    std::string bad_what;
    auto run_rows = [&](int64_t b, int64_t end) {
        for (int64_t r = b; r < end; ++r) {
            try {
                e->fn(x + r * n, dst + r * rb, n, qw);
            } catch (const std::exception &ex) {
                std::lock_guard<std::mutex> lock(mu);
                if (bad_row < 0 || r < bad_row) {
                    bad_row = r;
                    bad_what = ex.what();
                }
                return;
            }
        }
    };
    if (parts <= 1) {
        run_rows(0, rows);
    } else {
        pool.run(parts, [&](int i, int np) {
            int64_t b, end;
            split_range(rows, i, np, &b, &end);
            run_rows(b, end);
        });
    }
    if (bad_row >= 0)
        throw std::invalid_argument(std::string("quantize: ") + f->name + ": row " + std::to_string(bad_row) +
                                    ": " + bad_what);
}

}  // namespace lowbit::quant
