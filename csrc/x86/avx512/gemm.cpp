// The GEMM tier at the avx512 level (k-quants x Q8_K; Q4_0, Q4_1, Q8_0 x Q8_0 / Q8_1):
// csrc/x86/gemm.inl.
#define LOWBIT_ISA ISA_AVX512
#define LOWBIT_NS avx512
#include "../gemm.inl"
