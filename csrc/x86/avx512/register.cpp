// The avx512 level: its registration function, called once by the dispatcher when the CPU
// supports avx512 (and LOWBIT_MAX_ISA allows it). Every .cpp in this directory is built with
// this level's flags only (CMakeLists.txt); each family's body is a shared csrc/x86/*.inl
// compiled here with LOWBIT_ISA = ISA_AVX512.
#include "../../kernels.h"

namespace lowbit {
namespace avx512 {
// one declaration per family, defined in csrc/x86/avx512/<family>.cpp
void register_legacy(KernelTable &t);
void register_kquants(KernelTable &t);
void register_float(KernelTable &t);
void register_ternary(KernelTable &t);
void register_iquants(KernelTable &t);
void register_act(KernelTable &t);
void register_glu(KernelTable &t);
void register_kq_r8(KernelTable &t);  // Q4_K's and Q5_K's R8 layouts: their windows (kq_r8.cpp)
void register_lg_r8(KernelTable &t);  // Q4_0's, Q4_1's and Q8_0's R8 layouts: their windows (lg_r8.cpp)
void register_gemm(KernelTable &t);  // the GEMM tier's k-quants (gemm.cpp), Q4_K R8's GEMM
void register_delta(KernelTable &t);
void register_attn_q(KernelTable &t);  // attn_q.cpp (csrc/x86/attn_q.inl)
void register_attn(KernelTable &t);    // attn.cpp: the half cache's shared-rows kernel
}  // namespace avx512

void register_avx512(KernelTable &t) {
    avx512::register_legacy(t);
    avx512::register_kquants(t);
    avx512::register_float(t);
    avx512::register_ternary(t);
    avx512::register_iquants(t);
    avx512::register_act(t);
    avx512::register_glu(t);
    avx512::register_kq_r8(t);
    avx512::register_lg_r8(t);
    avx512::register_gemm(t);
    avx512::register_delta(t);
    avx512::register_attn_q(t);
    avx512::register_attn(t);
    (void)t;
}

}  // namespace lowbit
