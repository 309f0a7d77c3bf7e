// The amx level's BF16 rows (csrc/x86/bf16_tiles.inl) on the AMX emulator (csrc/x86/amx_tiles.h,
// LOWBIT_AMX_EMULATE), registered with the emulated GEMMs under LOWBIT_AMX=emulate on any CPU with
// avx2. Not part of the avx2 level. The emulator's TDPBF16PS is a model, not the hardware's bits
// (amx_tiles.h): the emulated level is held to its own invariances and to bounds.
#define LOWBIT_NS amx_emu
#define LOWBIT_AMX_EMULATE 1
#include "../bf16_tiles.inl"
