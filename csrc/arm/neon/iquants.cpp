// The neon level's iquants kernels: csrc/arm/iquants.inl built with this level's flags only.
#define LOWBIT_ISA ISA_NEON
#define LOWBIT_NS neon
#include "../iquants.inl"
