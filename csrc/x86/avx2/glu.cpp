// The FFN's GLU epilogue (SiLU / ReLU^2 times up) at the avx2 level: csrc/x86/glu.inl.
#define LOWBIT_ISA ISA_AVX2
#define LOWBIT_NS avx2
#include "../glu.inl"
