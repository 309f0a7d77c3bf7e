// The FFN's GLU epilogue (SiLU / ReLU^2 times up) at the avx512 level: csrc/x86/glu.inl.
#define LOWBIT_ISA ISA_AVX512
#define LOWBIT_NS avx512
#include "../glu.inl"
