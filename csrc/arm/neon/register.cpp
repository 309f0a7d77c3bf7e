// The neon level: its registration function, called once by the dispatcher when the CPU has
// the level (getauxval, csrc/dispatch.cpp) and LOWBIT_MAX_ISA allows it. Every .cpp in this
// directory is built with this level's flags only (CMakeLists.txt).
#include "../../kernels.h"

namespace lowbit {
namespace neon {
// one declaration per family, defined in csrc/arm/neon/<family>.cpp
void register_act(KernelTable &t);
void register_legacy(KernelTable &t);
void register_kquants(KernelTable &t);
void register_ternary(KernelTable &t);
void register_iquants(KernelTable &t);
void register_float(KernelTable &t);
void register_glu(KernelTable &t);
void register_attn(KernelTable &t);  // attn.cpp (the half cache and MLA)
void register_attn_q(KernelTable &t);  // attn_q.cpp (the quantized cache)
}  // namespace neon

void register_neon(KernelTable &t) {
    neon::register_act(t);
    neon::register_legacy(t);
    neon::register_kquants(t);
    neon::register_ternary(t);
    neon::register_iquants(t);
    neon::register_float(t);
    neon::register_glu(t);
    neon::register_attn(t);
    neon::register_attn_q(t);
}

}  // namespace lowbit
