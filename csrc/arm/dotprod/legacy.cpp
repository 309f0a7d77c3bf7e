// The dotprod level's legacy kernels: csrc/arm/legacy.inl built with this level's flags only.
#define LOWBIT_ISA ISA_DOTPROD
#define LOWBIT_NS dotprod
#include "../legacy.inl"
