// The GEMM tier at the avx2 level (8 tokens per ymm, vdot as vpmaddubsw + vpmaddwd + vpaddd):
// csrc/x86/gemm.inl. Q4_K, Q5_K, Q6_K, Q4_0, Q4_1 (codes |w| <= 64); not Q8_0 (see vdot).
#define LOWBIT_ISA ISA_AVX2
#define LOWBIT_NS avx2
#include "../gemm.inl"
