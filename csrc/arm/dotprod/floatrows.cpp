// The dotprod level's floatrows kernels: csrc/arm/floatrows.inl built with this level's flags only.
#define LOWBIT_ISA ISA_DOTPROD
#define LOWBIT_NS dotprod
#include "../floatrows.inl"
