// The amx level: its registration function, called once by the dispatcher when the CPU has
// AMX-TILE and AMX-INT8 on top of the avx512 level, the OS enables the tile state (XCR0) and
// grants this process its use (arch_prctl ARCH_REQ_XCOMP_PERM: csrc/dispatch.cpp). Every .cpp in
// this directory is built with avx512's flags plus -mamx-tile -mamx-int8 -mamx-bf16 (CMakeLists.txt).
#include "../../kernels.h"

namespace lowbit {
namespace amx {
void register_gemm(KernelTable &t);  // gemm.cpp: the k-quant family's, the legacy formats' and I2_S's GEMMs
void register_bf16(KernelTable &t);  // bf16.cpp: BF16's windows and GEMM on AMX-BF16 tiles
}  // namespace amx

void register_amx_hw(KernelTable &t, bool bf16) {
    amx::register_gemm(t);
    if (bf16) amx::register_bf16(t);
}

}  // namespace lowbit
