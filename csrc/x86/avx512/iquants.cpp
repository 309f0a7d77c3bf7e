// i-quant row kernels (IQ4_XS, IQ2_XXS, IQ2_XS, IQ3_XXS, IQ3_S, IQ2_S, IQ1_S, IQ1_M x Q8_K)
// at the avx512 level: csrc/x86/iquants.inl.
#define LOWBIT_ISA ISA_AVX512
#define LOWBIT_NS avx512
#include "../iquants.inl"
