// The dotprod level's ternary kernels: csrc/arm/ternary.inl built with this level's flags only.
#define LOWBIT_ISA ISA_DOTPROD
#define LOWBIT_NS dotprod
#include "../ternary.inl"
