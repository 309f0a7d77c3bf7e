// The Mamba-2 state update of one token on one head: the scalar reference (contract: scan_fn in
// kernels.h). The state update is ggml's (ssm_scan_f32 with a scalar A: s * dA and B * (x dt)
// each rounded, then their sum). The read-out dot runs in 8 lanes (lane l sums the elements
// j = l mod 8 in index order, products rounded before the add, then the lanes in the tree
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))): the SIMD levels do exactly these
// operations, so their bits equal these. No contraction (CMakeLists.txt).
#include "ref.h"

namespace lowbit::ref {

void ssm_scan(float *s, const float *B, const float *C, const float *x, float dt, float dA, float *y, int P, int N) {
    for (int i = 0; i < P; ++i) {
        float *row = s + (size_t)i * N;
        const float xdt = x[i] * dt;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int j = 0; j < N; ++j) {
            const float a = row[j] * dA, b = B[j] * xdt;
            row[j] = a + b;
            const float p = row[j] * C[j];
            acc[j & 7] += p;
        }
        y[i] = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    }
}

}  // namespace lowbit::ref
