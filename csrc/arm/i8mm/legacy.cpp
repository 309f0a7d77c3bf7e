// The i8mm level's legacy kernels (SMMLA): csrc/arm/legacy_mmla.inl built with this level's flags only.
#define LOWBIT_ISA ISA_I8MM
#define LOWBIT_NS i8mm
#include "../legacy_mmla.inl"
