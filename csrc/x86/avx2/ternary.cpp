// Ternary rows (I2_S x I8_S, TQ2_0 / TQ1_0 x Q8_K) at the avx2 level: csrc/x86/ternary.inl.
#define LOWBIT_ISA ISA_AVX2
#define LOWBIT_NS avx2
#include "../ternary.inl"
