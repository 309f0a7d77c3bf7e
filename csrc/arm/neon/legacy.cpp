// The neon level's legacy kernels: csrc/arm/legacy.inl built with this level's flags only.
#define LOWBIT_ISA ISA_NEON
#define LOWBIT_NS neon
#include "../legacy.inl"
