// The avx2 level: its registration function, called once by the dispatcher when the CPU
// supports avx2 (and LOWBIT_MAX_ISA allows it). Every .cpp in this directory is built with
// this level's flags only (CMakeLists.txt); each family's body is a shared csrc/x86/*.inl
// compiled here with LOWBIT_ISA = ISA_AVX2.
#include "../../kernels.h"

namespace lowbit {
namespace avx2 {
// one declaration per family, defined in csrc/x86/avx2/<family>.cpp
void register_legacy(KernelTable &t);
void register_kquants(KernelTable &t);
void register_float(KernelTable &t);
void register_ternary(KernelTable &t);
void register_iquants(KernelTable &t);
void register_act(KernelTable &t);
void register_glu(KernelTable &t);
void register_attn(KernelTable &t);
void register_delta(KernelTable &t);
void register_scan(KernelTable &t);   // the Mamba-2 state update (ssm_scan.cpp)
void register_attn_q(KernelTable &t);  // attn_q.cpp (csrc/x86/attn_q.inl)
void register_gemm(KernelTable &t);    // the GEMM tier (gemm.cpp, csrc/x86/gemm.inl)
void register_kq_r8(KernelTable &t);   // Q4_K's R8 layout: its windows (kq_r8.cpp)
void register_lg_r8(KernelTable &t);   // Q4_0's and Q4_1's R8 layouts: their windows (lg_r8.cpp)
}  // namespace avx2

void register_avx2(KernelTable &t) {
    avx2::register_legacy(t);
    avx2::register_kquants(t);
    avx2::register_float(t);
    avx2::register_ternary(t);
    avx2::register_iquants(t);
    avx2::register_act(t);
    avx2::register_glu(t);
    avx2::register_attn(t);
    avx2::register_delta(t);
    avx2::register_scan(t);
    avx2::register_attn_q(t);
    avx2::register_gemm(t);
    avx2::register_kq_r8(t);
    avx2::register_lg_r8(t);
    (void)t;
}

}  // namespace lowbit
