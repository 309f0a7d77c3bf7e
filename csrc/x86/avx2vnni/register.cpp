// The avx2vnni level: its registration function, called once by the dispatcher when the CPU
// supports avx2vnni (and LOWBIT_MAX_ISA allows it). Every .cpp in this directory is built with
// this level's flags only (CMakeLists.txt); each family's body is a shared csrc/x86/*.inl
// compiled here with LOWBIT_ISA = ISA_AVX2VNNI.
#include "../../kernels.h"

namespace lowbit {
namespace avx2vnni {
// one declaration per family, defined in csrc/x86/avx2vnni/<family>.cpp
void register_legacy(KernelTable &t);
void register_kquants(KernelTable &t);
void register_float(KernelTable &t);
void register_ternary(KernelTable &t);
void register_iquants(KernelTable &t);
void register_act(KernelTable &t);
void register_gemm(KernelTable &t);  // the GEMM tier (gemm.cpp)
void register_attn_q(KernelTable &t);  // the quantized cache's attention (attn_q.cpp)
}  // namespace avx2vnni

void register_avx2vnni(KernelTable &t) {
    avx2vnni::register_legacy(t);
    avx2vnni::register_kquants(t);
    avx2vnni::register_float(t);
    avx2vnni::register_ternary(t);
    avx2vnni::register_iquants(t);
    avx2vnni::register_act(t);
    avx2vnni::register_gemm(t);
    avx2vnni::register_attn_q(t);
    (void)t;
}

}  // namespace lowbit
