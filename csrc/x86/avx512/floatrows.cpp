// Float rows (F32, F16, BF16 x float32 activations) at the avx512 level: csrc/x86/floatrows.inl.
#define LOWBIT_ISA ISA_AVX512
#define LOWBIT_NS avx512
#include "../floatrows.inl"
