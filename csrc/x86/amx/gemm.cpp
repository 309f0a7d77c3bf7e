// The GEMM tier at the amx level: the k-quant family's GEMMs (csrc/x86/gemm.inl) with AMX-INT8
// tiles for the sub-block dots (gemm.inl's mk_amx, csrc/x86/amx_tiles.h), on avx512's lane
// vectors of 16 tokens; everything else at this level is avx512's.
#define LOWBIT_ISA ISA_AMX
#define LOWBIT_NS amx
#define LOWBIT_AMX 1
#include "../gemm.inl"
