// The neon level's GLU epilogue: csrc/arm/glu.inl built with this level's flags only.
#define LOWBIT_ISA ISA_NEON
#define LOWBIT_NS neon
#include "../glu.inl"
