// The i8mm level: SMMLA (2 rows x 2 tokens per instruction) for the legacy formats; every
// other family runs the dotprod level's kernels here (the dispatcher overlays the levels in
// order), since SMMLA only pays where rows can be paired cheaply (32-weight blocks).
#include "../../kernels.h"

namespace lowbit {
namespace i8mm {
void register_legacy_mmla(KernelTable &t);  // csrc/arm/i8mm/legacy.cpp
}  // namespace i8mm

void register_i8mm(KernelTable &t) { i8mm::register_legacy_mmla(t); }

}  // namespace lowbit
