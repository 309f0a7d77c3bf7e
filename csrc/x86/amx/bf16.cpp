// The amx level's BF16 rows on the hardware's AMX-BF16 tiles (csrc/x86/bf16_tiles.inl): registered
// when the CPU has amx_bf16 besides the level's amx_tile and amx_int8 (csrc/dispatch.cpp).
#define LOWBIT_NS amx
#include "../bf16_tiles.inl"
