// k-quant rows (Q2_K .. Q6_K x Q8_K) at the avx2vnni level: csrc/x86/kquants.inl.
#define LOWBIT_ISA ISA_AVX2VNNI
#define LOWBIT_NS avx2vnni
#include "../kquants.inl"
