// The gated delta rule of one token on one value head: the scalar reference (contract:
// delta_fn in kernels.h). Dots run in 8 lanes (lane l sums the elements i = l mod 8 in index
// order, the lanes then added in a fixed tree), an order compilers vectorise without
// reassociating; the products and sums round as written (no contraction: CMakeLists.txt).
#include "ref.h"

namespace lowbit::ref {

static inline float dot8(const float *a, const float *b, int n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) s[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; ++i, ++l) s[l] += a[i] * b[i];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

void delta_rule(float *M, const float *k, const float *q, const float *v, float decay, float beta, float scale,
                float *o, int S) {
    for (int j = 0; j < S; ++j) {
        float *row = M + (size_t)j * S;
        for (int i = 0; i < S; ++i) row[i] *= decay;
        const float d = (v[j] - dot8(row, k, S)) * beta;
        for (int i = 0; i < S; ++i) row[i] += k[i] * d;
        o[j] = dot8(row, q, S) * scale;
    }
}

}  // namespace lowbit::ref
