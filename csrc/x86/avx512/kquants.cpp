// k-quant rows (Q2_K .. Q6_K x Q8_K) at the avx512 level: csrc/x86/kquants.inl.
#define LOWBIT_ISA ISA_AVX512
#define LOWBIT_NS avx512
#include "../kquants.inl"
