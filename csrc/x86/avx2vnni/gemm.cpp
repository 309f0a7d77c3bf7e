// The GEMM tier at the avx2vnni level (8 tokens per ymm): csrc/x86/gemm.inl.
#define LOWBIT_ISA ISA_AVX2VNNI
#define LOWBIT_NS avx2vnni
#include "../gemm.inl"
