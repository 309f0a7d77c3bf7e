// The avx level (AVX without AVX2 / FMA / F16C): its registration function, called once by the
// dispatcher when the CPU has AVX, SSSE3 and SSE4.1 and LOWBIT_MAX_ISA allows it. Every .cpp in
// this directory is built with -mavx only (CMakeLists.txt). The families it covers run at least
// this instead of the scalar reference on such a CPU; the rest (i-quants other than IQ4_NL,
// ternary, GLU, attention) stay on the reference there.
#include "../../kernels.h"

namespace lowbit {
namespace avx {
void register_act(KernelTable &t);      // Q8_0 Q8_1 Q8_K I8_S quantizers (act.cpp)
void register_legacy(KernelTable &t);   // Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL MXFP4 (legacy.cpp)
void register_kquants(KernelTable &t);  // Q2_K .. Q6_K (kquants.cpp)
void register_float(KernelTable &t);    // F32 F16 BF16 (floatrows.cpp)
}  // namespace avx

void register_avx(KernelTable &t) {
    avx::register_act(t);
    avx::register_legacy(t);
    avx::register_kquants(t);
    avx::register_float(t);
}

}  // namespace lowbit
