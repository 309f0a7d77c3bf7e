// The GEMM tier at the avx2 level (8 tokens per ymm, vdot as vpmaddubsw + vpmaddwd + vpaddd):
// csrc/x86/gemm.inl. Q4_K, Q5_K, Q6_K, Q4_0, Q4_1 (codes |w| <= 64); Q8_0 by the sign trick
// (vdot_sign: vpmaddubsw(|w|, vpsignb(a, w)), bitwise the avx2 window kernels).
#define LOWBIT_ISA ISA_AVX2
#define LOWBIT_NS avx2
#include "../gemm.inl"
