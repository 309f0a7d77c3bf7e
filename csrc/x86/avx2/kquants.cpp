// k-quant rows (Q2_K .. Q6_K x Q8_K) at the avx2 level: csrc/x86/kquants.inl.
#define LOWBIT_ISA ISA_AVX2
#define LOWBIT_NS avx2
#include "../kquants.inl"
