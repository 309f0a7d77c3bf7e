// The k-quant GEMM tier (Q4_K, Q5_K, Q6_K x Q8_K) at the avx512 level: csrc/x86/gemm_kquants.inl.
#define LOWBIT_ISA ISA_AVX512
#define LOWBIT_NS avx512
#include "../gemm_kquants.inl"
