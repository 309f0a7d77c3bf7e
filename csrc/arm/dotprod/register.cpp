// The dotprod level: its registration function, called once by the dispatcher when the CPU has
// the level (getauxval, csrc/dispatch.cpp) and LOWBIT_MAX_ISA allows it. Every .cpp in this
// directory is built with this level's flags only (CMakeLists.txt).
#include "../../kernels.h"

namespace lowbit {
namespace dotprod {
// one declaration per family, defined in csrc/arm/dotprod/<family>.cpp
void register_act(KernelTable &t);
void register_legacy(KernelTable &t);
void register_kquants(KernelTable &t);
void register_ternary(KernelTable &t);
void register_iquants(KernelTable &t);
void register_float(KernelTable &t);
void register_attn_q(KernelTable &t);  // attn_q.cpp: SDOT for the quantized K dots
}  // namespace dotprod

void register_dotprod(KernelTable &t) {
    dotprod::register_act(t);
    dotprod::register_legacy(t);
    dotprod::register_kquants(t);
    dotprod::register_ternary(t);
    dotprod::register_iquants(t);
    dotprod::register_float(t);
    dotprod::register_attn_q(t);
}

}  // namespace lowbit
