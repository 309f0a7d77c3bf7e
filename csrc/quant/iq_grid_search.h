// The search shared by the IQ2 / IQ3 grid quantizers (iq2_iq3.cpp) and the neighbour searches
// of IQ1 (iq1.cpp). Internal to csrc/quant/.
#pragma once
#include <cfloat>
#include <stdexcept>

#include "common.h"
#include "iq_grid.h"

namespace lowbit::quant {

// The grid point nearest to scale * (2*level + 1) ~ xval[group] among the neighbours of an
// off-grid key, in the weighted distance sum(w * diff * diff) (the first of equals wins); its
// levels go to L. ggml aborts where no distance is below FLT_MAX (inf / NaN inputs): lowbit
// throws, the driver turns that into an error naming the row.
// G: the grid's group (values per point), a compile-time constant for the inner loops.
// Four neighbours' distances are summed side by side (independent chains, each in ggml's
// order: the same floats), then compared in list order.
template <int G>
inline int nearest_grid_point(const GridIndex &g, uint32_t key, const float *xval, const float *w, float scale,
                              int8_t *L) {
    const uint16_t *nb = g.near(key);
    const int count = nb[0];
    float best_d2 = FLT_MAX;
    int best = -1;
    int j = 1;
    for (; j + 3 <= count; j += 4) {
        const float *q0 = g.odd_point(nb[j]), *q1 = g.odd_point(nb[j + 1]);
        const float *q2 = g.odd_point(nb[j + 2]), *q3 = g.odd_point(nb[j + 3]);
        float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
        for (int i = 0; i < G; ++i) {
            const float e0 = scale * q0[i] - xval[i], e1 = scale * q1[i] - xval[i];
            const float e2 = scale * q2[i] - xval[i], e3 = scale * q3[i] - xval[i];
            d0 += w[i] * e0 * e0;
            d1 += w[i] * e1 * e1;
            d2 += w[i] * e2 * e2;
            d3 += w[i] * e3 * e3;
        }
        const float d[4] = {d0, d1, d2, d3};
        for (int t = 0; t < 4; ++t) {
            if (d[t] < best_d2) {
                best_d2 = d[t];
                best = nb[j + t];
            }
        }
    }
    for (; j <= count; ++j) {
        const float *q = g.odd_point(nb[j]);
        float d2 = 0;
        for (int i = 0; i < G; ++i) {
            const float diff = scale * q[i] - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = nb[j];
        }
    }
    if (best < 0) throw std::domain_error("no grid point at a finite distance (values too large or not finite)");
    const int8_t *pl = g.point(best);
    for (int i = 0; i < G; ++i) L[i] = pl[i];
    return best;
}

}  // namespace lowbit::quant
