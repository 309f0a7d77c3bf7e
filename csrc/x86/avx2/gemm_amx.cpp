// The amx level's GEMMs run by the AMX emulator (csrc/x86/amx_tiles.h, LOWBIT_AMX_EMULATE) on avx2's
// lane vectors of 8 tokens: the amx microkernel, its tile shapes and strides tested on any x86
// CPU with avx2 (LOWBIT_AMX=emulate makes the dispatcher offer the amx level with these kernels:
// csrc/dispatch.cpp). Not part of the avx2 level (register_avx2 does not call it). Slow by design:
// the tile products are scalar loops.
#define LOWBIT_ISA ISA_AMX
#define LOWBIT_NS amx_emu
#define LOWBIT_KNAME amx
#define LOWBIT_AMX 1
#define LOWBIT_AMX_EMULATE 1
#include "../gemm.inl"
