// The dotprod level's kquants kernels: csrc/arm/kquants.inl built with this level's flags only.
#define LOWBIT_ISA ISA_DOTPROD
#define LOWBIT_NS dotprod
#include "../kquants.inl"
