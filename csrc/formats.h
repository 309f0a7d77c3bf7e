// THE format table of lowbit: GGUF type ids, block structs, sizes, activation pairing.
//
// Every other file (C++ and Python) reads sizes from here; there is no second copy.
// Block layouts are byte-compatible with ggml's (and, for I2_S, with bitnet.cpp's x86
// layout). Each struct carries a static_assert on its size.
#pragma once
#include <cstddef>
#include <cstdint>

namespace lowbit {

// GGUF / ggml type ids. Activation-only formats that never appear in a GGUF file
// (I8_S) get ids above 1000 so they cannot collide with a future ggml type.
enum TypeId : int {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7,
    T_Q8_0 = 8, T_Q8_1 = 9, T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13,
    T_Q6_K = 14, T_Q8_K = 15, T_IQ2_XXS = 16, T_IQ2_XS = 17, T_IQ3_XXS = 18,
    T_IQ1_S = 19, T_IQ4_NL = 20, T_IQ3_S = 21, T_IQ2_S = 22, T_IQ4_XS = 23,
    T_IQ1_M = 29, T_BF16 = 30, T_TQ1_0 = 34, T_TQ2_0 = 35,
    T_I2_S = 36,      // bitnet.cpp's ternary type (its GGUF files use id 36)
    T_MXFP4 = 39,     // OCP microscaling FP4 (gpt-oss's experts)
    T_I8_S = 1001,    // lowbit activation format paired with I2_S (see block below)
};

constexpr int QK = 32;      // legacy block (Q4_0 .. Q8_1, IQ4_NL, MXFP4)
constexpr int QK_K = 256;   // super-block (k-quants, i-quants, TQ*)
constexpr int QK_I2S = 128; // I2_S block

using fp16_t = uint16_t;    // IEEE half, stored as bits
using bf16_t = uint16_t;    // bfloat16, stored as bits

// ---- legacy formats: 32 weights per block, w = d * q (+ m) -----------------------------
struct block_q4_0 { fp16_t d; uint8_t qs[QK / 2]; };              // q = nibble - 8; low nibbles are weights 0..15
struct block_q4_1 { fp16_t d, m; uint8_t qs[QK / 2]; };           // w = d*nibble + m
struct block_q5_0 { fp16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; }; // 5th bit of weight j in qh bit j; q - 16
struct block_q5_1 { fp16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; };
struct block_q8_0 { fp16_t d; int8_t qs[QK]; };
struct block_q8_1 { fp16_t d, s; int8_t qs[QK]; };                // s = d * sum(qs)
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20, "legacy sizes");
static_assert(sizeof(block_q5_0) == 22 && sizeof(block_q5_1) == 24, "legacy sizes");
static_assert(sizeof(block_q8_0) == 34 && sizeof(block_q8_1) == 36, "legacy sizes");

// ---- k-quants: 256 weights per super-block ---------------------------------------------
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; fp16_t d, dmin; };
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; fp16_t d; };
struct block_q4_K { fp16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; };
struct block_q5_K { fp16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; fp16_t d; };
struct block_q8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };  // bsums: sum of each 16 qs
static_assert(sizeof(block_q2_K) == 84 && sizeof(block_q3_K) == 110, "k sizes");
static_assert(sizeof(block_q4_K) == 144 && sizeof(block_q5_K) == 176, "k sizes");
static_assert(sizeof(block_q6_K) == 210 && sizeof(block_q8_K) == 292, "k sizes");

// ---- i-quants ----------------------------------------------------------------------------
struct block_iq2_xxs { fp16_t d; uint16_t qs[QK_K / 8]; };
struct block_iq2_xs  { fp16_t d; uint16_t qs[QK_K / 8]; uint8_t scales[QK_K / 32]; };
struct block_iq2_s   { fp16_t d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t scales[QK_K / 32]; };
struct block_iq3_xxs { fp16_t d; uint8_t qs[3 * QK_K / 8]; };
struct block_iq3_s   { fp16_t d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t signs[QK_K / 8]; uint8_t scales[QK_K / 64]; };
struct block_iq1_s   { fp16_t d; uint8_t qs[QK_K / 8]; uint16_t qh[QK_K / 32]; };
struct block_iq1_m   { uint8_t qs[QK_K / 8]; uint8_t qh[QK_K / 16]; uint8_t scales[QK_K / 32]; };  // d packed in scales
struct block_iq4_nl  { fp16_t d; uint8_t qs[QK / 2]; };
struct block_iq4_xs  { fp16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };
static_assert(sizeof(block_iq2_xxs) == 66 && sizeof(block_iq2_xs) == 74 && sizeof(block_iq2_s) == 82, "iq sizes");
static_assert(sizeof(block_iq3_xxs) == 98 && sizeof(block_iq3_s) == 110, "iq sizes");
static_assert(sizeof(block_iq1_s) == 50 && sizeof(block_iq1_m) == 56, "iq sizes");
static_assert(sizeof(block_iq4_nl) == 18 && sizeof(block_iq4_xs) == 136, "iq sizes");

// ---- MXFP4 (OCP microscaling): 32 e2m1 values and one e8m0 scale -------------------------
// qs[j]: low nibble codes weight j, high nibble weight j+16 (as IQ4_NL). A code c is an e2m1
// value stored DOUBLED as an int8, kvalues_mxfp4[c] (csrc/ref/mxfp4.cpp), and e is the scale's
// biased exponent, so w = kvalues_mxfp4[c] * 2^(e - 128)  (= e2m1(c) * 2^(e - 127)).
// No fp16 anywhere: the block is 17 bytes, unaligned in a row.
struct block_mxfp4 { uint8_t e; uint8_t qs[QK / 2]; };
static_assert(sizeof(block_mxfp4) == 17, "mxfp4 size");

// ---- ternary -----------------------------------------------------------------------------
// TQ1_0: 5 trits per byte (base 3, most significant trit first after multiplying by 3),
// qs holds 240 weights (48 bytes), qh the last 16 (4 per byte).
struct block_tq1_0 { uint8_t qs[(QK_K - 4 * QK_K / 64) / 5]; uint8_t qh[QK_K / 64]; fp16_t d; };
struct block_tq2_0 { uint8_t qs[QK_K / 4]; fp16_t d; };   // 2-bit codes 0..2 -> -1..1
static_assert(sizeof(block_tq1_0) == 54 && sizeof(block_tq2_0) == 66, "tq sizes");

// I2_S (bitnet.cpp, x86 layout): 128 weights in 32 bytes; byte j holds weights
// j, 32+j, 64+j, 96+j in bits 7:6, 5:4, 3:2, 1:0. Codes 0,1,2 mean -1,0,+1.
// One float scale per TENSOR, stored right after all the codes (rows*n/4 bytes), and
// the tensor's data is padded by 32 bytes for it: nbytes = rows*n/4 + 32.
struct block_i2_s { uint8_t qs[QK_I2S / 4]; };
static_assert(sizeof(block_i2_s) == 32, "i2_s size");
constexpr size_t I2S_TENSOR_PAD = 32;

// I8_S (activations for I2_S), one per token row of n values:
//   float scale  (= 127 / max|x|, or 1 when the row is all zero: x ~ q / scale)
//   int32 sum    (sum of the int8 q, to remove I2_S's code offset once per row)
//   int8  q[n]   (round-half-to-even(x * scale), clamped to [-127, 127]; NaN -> 0, +-inf -> +-127)
constexpr size_t I8S_HEADER = 8;

// ---- the table -----------------------------------------------------------------------------
struct Format {
    int id;
    const char *name;
    int block;          // weights per block
    int bytes;          // bytes per block
    int act;            // activation format id its row kernel takes (T_F32 for float rows)
    bool weight;        // may be used as a weight format
    bool activation;    // is an activation format (has quantize_act)
};

const Format *format_by_id(int id);          // nullptr if unknown
const Format *format_by_name(const char *n); // nullptr if unknown
const Format *formats_begin();
const Format *formats_end();

// Bytes of one row of n values in format f (n must be a multiple of f->block).
// I8_S rows have a header; everything else is n / block * bytes.
size_t row_bytes(const Format *f, int64_t n);
// Extra bytes a tensor of this format carries after its rows (I2_S: the scale + pad).
size_t tensor_pad(const Format *f);

}  // namespace lowbit
