// The neon level's floatrows kernels: csrc/arm/floatrows.inl built with this level's flags only.
#define LOWBIT_ISA ISA_NEON
#define LOWBIT_NS neon
#include "../floatrows.inl"
