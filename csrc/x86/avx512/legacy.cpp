// Legacy rows (Q4_0 Q5_0 Q8_0 IQ4_NL MXFP4 x Q8_0, Q4_1 Q5_1 x Q8_1) at the avx512 level: csrc/x86/legacy.inl.
#define LOWBIT_ISA ISA_AVX512
#define LOWBIT_NS avx512
#include "../legacy.inl"
