// The neon level's kquants kernels: csrc/arm/kquants.inl built with this level's flags only.
#define LOWBIT_ISA ISA_NEON
#define LOWBIT_NS neon
#include "../kquants.inl"
