// The dotprod level's iquants kernels: csrc/arm/iquants.inl built with this level's flags only.
#define LOWBIT_ISA ISA_DOTPROD
#define LOWBIT_NS dotprod
#include "../iquants.inl"
