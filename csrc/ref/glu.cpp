// The GLU epilogue's scalar reference (the spec; contract: glu_fn in kernels.h).
//
// SiLU uses the exp of ggml's vectorised SwiGLU (ggml_v_expf, itself from Arm's
// optimized-routines expf), written here as scalar float operations, one std::fmaf wherever
// the SIMD levels use an FMA, so that every level computes the same bits. This matters for
// parity with llama.cpp: its SwiGLU runs this exp (not libm's expf), and a last-bit
// difference in silu(g) * u can flip an int8 rounding of the down projection's activations.
//
//   exp(x):  n = round(x / ln2)           (through the 1.5 * 2^23 shifter: round to nearest even)
//            b = x - n * ln2               (ln2 split in two constants, hi exact in 15 bits)
//            p(b) = 1 + c1 b + (c2 + c3 b) b^2 + (c4 + c5 b) b^4      (|b| <= ~0.35)
//            exp(x) = p(b) * 2^n, as avx512's vscalefps: the exact product rounded once
//            (here: two power-of-two factors, the first product exact, the second rounds).
//            |n| > 192 (|x| > ~133, or +-inf): 0 for n < 0, +inf for n > 0; NaN stays NaN.
//   silu(g) = g / (1 + exp(0 - g))   (g = -inf gives -inf / inf = NaN, as ggml and libm's
//             formula do; g = +inf gives +inf; g <= -~88.7 gives -0; NaN gives NaN)
//   relu2(g) = r * r with r = g > 0 ? g : 0   (NaN gives 0, as ggml_vec_relu)
//   swiglu_oai (gpt-oss): ggml's scalar loop as it is, libm's expf (kernels.h; this level only)
//   geglu (gemma3): ggml's ggml_vec_geglu_f32 with its fp16 gelu table (kernels.h GLU_GEGLU);
//             the table is built here once, as ggml_cpu_init builds ggml_table_gelu_f16, and
//             the SIMD levels gather from the same table (ref::gelu_table), so they equal
//             this loop bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "../fp16.h"
#include "ref.h"

namespace lowbit::ref {

namespace {

inline float pow2i(int e) {  // 2^e as a float, e in [-126, 127]
    const uint32_t u = (uint32_t)(e + 127) << 23;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

}  // namespace

float glu_expf(float x) {
    const float shift = 0x1.8p23f;
    const float z = std::fmaf(x, 0x1.715476p+0f, shift);  // x / ln2 + shifter, rounded once
    const float n = z - shift;                            // round(x / ln2), exact
    float b = std::fmaf(-n, 0x1.62e4p-1f, x);             // x - n * ln2_hi (exact for |n| <= 192)
    b = std::fmaf(-n, 0x1.7f7d1cp-20f, b);                // - n * ln2_lo
    const float u = b * b;
    const float p45 = std::fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f);
    const float p23 = std::fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f);
    const float p01 = std::fmaf(0x1.ffffecp-1f, b, 1.0f);
    const float p = std::fmaf(std::fmaf(p45, u, p23), u, p01);
    if (std::fabs(n) > 192.0f) return n > 0.0f ? INFINITY : 0.0f;  // (false for NaN)
    if (n != n) return n;                                             // NaN in, NaN out
    // p * 2^n rounded once: n = n1 + n2 with n1, n2 in [-96, 96]; p * 2^n1 is exact (p in
    // ~[0.7, 1.42], result normal), the second multiply is the one rounding (to a
    // subnormal, +inf or an exact value), the same as vscalefps.
    const int ni = (int)n, n1 = ni >> 1, n2 = ni - n1;  // >> of a negative int: floor (C++20, gcc)
    return (p * pow2i(n1)) * pow2i(n2);
}

// ggml_gelu_f32: the tanh approximation in float, libm's tanhf, as llama.cpp's build of ggml
// computes it: its compiler contracts 1 + A x x into one fma(A x, x, 1) (this equals
// ggml_table_gelu_f16 at all 65536 entries, tests/test_gemma_glm.py; without the fma one entry,
// x = -1.999, is a half ulp apart); the rest in C's order, each product rounded.
static float gelu_tanh_f32(float x) {
    const float a = 0.044715f, s = 0.79788456080286535587989211986876f;  // GELU_COEF_A, sqrt(2/pi)
    return 0.5f * x * (1.0f + std::tanh(s * x * std::fmaf(a * x, x, 1.0f)));
}

const float *gelu_table() {
    static const std::vector<float> table = [] {  // (thread-safe static initialisation)
        std::vector<float> t((size_t)1 << 16);
        for (uint32_t h = 0; h < (1u << 16); ++h)
            t[h] = fp16_to_f32(f32_to_fp16(gelu_tanh_f32(fp16_to_f32((uint16_t)h))));
        return t;
    }();
    return table.data();
}

void glu(const float *g, const float *u, float *out, int64_t n, int kind) {
    if (kind == GLU_GEGLU) {
        const float *t = gelu_table();
        for (int64_t i = 0; i < n; ++i) {
            const float gv = g[i];
            out[i] = gv <= -10.0f ? 0.0f : gv >= 10.0f ? gv * u[i] : t[f32_to_fp16(gv)] * u[i];
        }
        return;
    }
    if (kind == GLU_SWIGLU_OAI) {
        for (int64_t i = 0; i < n; ++i) {
            const float x = std::min(g[i], kSwigluOaiLimit);
            const float y = std::min(std::max(u[i], -kSwigluOaiLimit), kSwigluOaiLimit);
            out[i] = x / (1.0f + std::exp(kSwigluOaiAlpha * (-x))) * (y + 1.0f);
        }
        return;
    }
    if (kind == GLU_RELU2) {
        for (int64_t i = 0; i < n; ++i) {
            const float r = g[i] > 0.0f ? g[i] : 0.0f;
            out[i] = r * r * u[i];
        }
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        const float gv = g[i];
        out[i] = gv / (1.0f + glu_expf(0.0f - gv)) * u[i];
    }
}

void register_glu(KernelTable &t) { t.glu = GluKernel{glu, "glu_scalar", ISA_SCALAR}; }

}  // namespace lowbit::ref
