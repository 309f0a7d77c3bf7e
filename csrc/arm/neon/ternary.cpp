// The neon level's ternary kernels: csrc/arm/ternary.inl built with this level's flags only.
#define LOWBIT_ISA ISA_NEON
#define LOWBIT_NS neon
#include "../ternary.inl"
