// The dotprod level's act kernels: csrc/arm/act.inl built with this level's flags only.
#define LOWBIT_ISA ISA_DOTPROD
#define LOWBIT_NS dotprod
#include "../act.inl"
