// lowbit's weight quantizers: float rows -> a format's bytes, byte-identical to ggml's
// ggml_quantize_chunk (the tests compare every format, with and without an importance
// matrix). Rows are independent, so they are split over the thread pool; the result never
// depends on the thread count.
#pragma once
#include <cstdint>

namespace lowbit::quant {

// lowbit quantizes to format id (a GGUF type id, formats.h) here.
bool has_quantizer(int id);
// The format needs an importance matrix (as ggml_quantize_requires_imatrix).
bool needs_imatrix(int id);
// Whether the format's quantizer reads an importance matrix at all.
bool uses_imatrix(int id);
// x[rows][n] -> dst (rows * row_bytes(n), plus the tensor pad for I2_S). imatrix: n floats
// (one per column, shared by every row) or null. threads <= 0: the pool's size.
// Throws std::invalid_argument for a format without a quantizer, a bad n, a missing
// required imatrix, or a row a grid i-quant cannot quantize (inf / NaN / overflowing values,
// where ggml aborts the process), naming the first such row.
void quantize_rows(int id, const float *x, uint8_t *dst, int64_t rows, int64_t n, const float *imatrix,
                   int threads);

}  // namespace lowbit::quant
