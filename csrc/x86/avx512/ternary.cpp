// Ternary rows (I2_S x I8_S, TQ2_0 / TQ1_0 x Q8_K) at the avx512 level: csrc/x86/ternary.inl.
#define LOWBIT_ISA ISA_AVX512
#define LOWBIT_NS avx512
#include "../ternary.inl"
