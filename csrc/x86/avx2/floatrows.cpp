// Float rows (F32, F16, BF16 x float32 activations) at the avx2 level: csrc/x86/floatrows.inl.
#define LOWBIT_ISA ISA_AVX2
#define LOWBIT_NS avx2
#include "../floatrows.inl"
