// The GEMM tier at the amx level: the k-quant family's, the legacy formats' and I2_S's GEMMs
// (csrc/x86/gemm.inl) with AMX-INT8 tiles for the sub-block / block / row dots (gemm.inl's mk_amx,
// mk_amx_legacy, mk_amx_i2s; csrc/x86/amx_tiles.h), on avx512's lane vectors of 16 tokens;
// everything else at this level (windows, attention, quantizers) is avx512's.
#define LOWBIT_ISA ISA_AMX
#define LOWBIT_NS amx
#define LOWBIT_AMX 1
#include "../gemm.inl"
