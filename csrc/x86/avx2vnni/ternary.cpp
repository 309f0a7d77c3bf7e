// Ternary rows (I2_S x I8_S, TQ2_0 / TQ1_0 x Q8_K) at the avx2vnni level: csrc/x86/ternary.inl.
#define LOWBIT_ISA ISA_AVX2VNNI
#define LOWBIT_NS avx2vnni
#include "../ternary.inl"
