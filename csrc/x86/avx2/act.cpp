// Activation quantizers (Q8_0, Q8_1, Q8_K, I8_S) at the avx2 level: csrc/x86/act.inl.
#define LOWBIT_ISA ISA_AVX2
#define LOWBIT_NS avx2
#include "../act.inl"
