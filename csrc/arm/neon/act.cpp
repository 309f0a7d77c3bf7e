// The neon level's act kernels: csrc/arm/act.inl built with this level's flags only.
#define LOWBIT_ISA ISA_NEON
#define LOWBIT_NS neon
#include "../act.inl"
