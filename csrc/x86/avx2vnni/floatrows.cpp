// Float rows (F32, F16, BF16 x float32 activations) at the avx2vnni level: csrc/x86/floatrows.inl.
#define LOWBIT_ISA ISA_AVX2VNNI
#define LOWBIT_NS avx2vnni
#include "../floatrows.inl"
