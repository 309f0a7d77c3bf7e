// The format table (see formats.h). Python reads it through _lowbit.formats().
#include "formats.h"

#include <cstring>

namespace lowbit {

// name, block, bytes per block, paired activation format, weight?, activation?
static const Format kFormats[] = {
    {T_F32, "F32", 1, 4, T_F32, true, true},
    {T_F16, "F16", 1, 2, T_F32, true, false},
    {T_BF16, "BF16", 1, 2, T_F32, true, false},
    {T_Q4_0, "Q4_0", QK, sizeof(block_q4_0), T_Q8_0, true, false},
    {T_Q4_1, "Q4_1", QK, sizeof(block_q4_1), T_Q8_1, true, false},
    {T_Q5_0, "Q5_0", QK, sizeof(block_q5_0), T_Q8_0, true, false},
    {T_Q5_1, "Q5_1", QK, sizeof(block_q5_1), T_Q8_1, true, false},
    {T_Q8_0, "Q8_0", QK, sizeof(block_q8_0), T_Q8_0, true, true},
    {T_Q8_1, "Q8_1", QK, sizeof(block_q8_1), T_Q8_1, false, true},
    {T_Q2_K, "Q2_K", QK_K, sizeof(block_q2_K), T_Q8_K, true, false},
    {T_Q3_K, "Q3_K", QK_K, sizeof(block_q3_K), T_Q8_K, true, false},
    {T_Q4_K, "Q4_K", QK_K, sizeof(block_q4_K), T_Q8_K, true, false},
    {T_Q5_K, "Q5_K", QK_K, sizeof(block_q5_K), T_Q8_K, true, false},
    {T_Q6_K, "Q6_K", QK_K, sizeof(block_q6_K), T_Q8_K, true, false},
    {T_Q8_K, "Q8_K", QK_K, sizeof(block_q8_K), T_Q8_K, false, true},
    {T_IQ2_XXS, "IQ2_XXS", QK_K, sizeof(block_iq2_xxs), T_Q8_K, true, false},
    {T_IQ2_XS, "IQ2_XS", QK_K, sizeof(block_iq2_xs), T_Q8_K, true, false},
    {T_IQ2_S, "IQ2_S", QK_K, sizeof(block_iq2_s), T_Q8_K, true, false},
    {T_IQ3_XXS, "IQ3_XXS", QK_K, sizeof(block_iq3_xxs), T_Q8_K, true, false},
    {T_IQ3_S, "IQ3_S", QK_K, sizeof(block_iq3_s), T_Q8_K, true, false},
    {T_IQ4_NL, "IQ4_NL", QK, sizeof(block_iq4_nl), T_Q8_0, true, false},
    {T_IQ4_XS, "IQ4_XS", QK_K, sizeof(block_iq4_xs), T_Q8_K, true, false},
    {T_IQ1_S, "IQ1_S", QK_K, sizeof(block_iq1_s), T_Q8_K, true, false},
    {T_IQ1_M, "IQ1_M", QK_K, sizeof(block_iq1_m), T_Q8_K, true, false},
    {T_TQ1_0, "TQ1_0", QK_K, sizeof(block_tq1_0), T_Q8_K, true, false},
    {T_TQ2_0, "TQ2_0", QK_K, sizeof(block_tq2_0), T_Q8_K, true, false},
    {T_MXFP4, "MXFP4", QK, sizeof(block_mxfp4), T_Q8_0, true, false},
    {T_I2_S, "I2_S", QK_I2S, sizeof(block_i2_s), T_I8_S, true, false},
    {T_I8_S, "I8_S", 1, 1, T_I8_S, false, true},
};

const Format *formats_begin() { return kFormats; }
const Format *formats_end() { return kFormats + sizeof(kFormats) / sizeof(kFormats[0]); }

const Format *format_by_id(int id) {
    for (const Format *f = formats_begin(); f != formats_end(); ++f)
        if (f->id == id) return f;
    return nullptr;
}

const Format *format_by_name(const char *n) {
    for (const Format *f = formats_begin(); f != formats_end(); ++f)
        if (std::strcmp(f->name, n) == 0) return f;
    return nullptr;
}

size_t row_bytes(const Format *f, int64_t n) {
    if (f->id == T_I8_S) return I8S_HEADER + (size_t)n;
    return (size_t)(n / f->block) * (size_t)f->bytes;
}

size_t tensor_pad(const Format *f) { return f->id == T_I2_S ? I2S_TENSOR_PAD : 0; }

}  // namespace lowbit
