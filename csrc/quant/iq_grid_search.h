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
inline int nearest_grid_point(const GridIndex &g, uint32_t key, const float *xval, const float *w, float scale,
                              int8_t *L) {
    const uint16_t *nb = g.near(key);
    float best_d2 = FLT_MAX;
    int best = -1;
    for (int j = 1; j <= nb[0]; ++j) {
        const int8_t *pl = g.point(nb[j]);
        float d2 = 0;
        for (int i = 0; i < g.group; ++i) {
            const float q = (float)(2 * pl[i] + 1);
            const float diff = scale * q - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = nb[j];
        }
    }
    if (best < 0) throw std::domain_error("no grid point at a finite distance (values too large or not finite)");
    const int8_t *pl = g.point(best);
    for (int i = 0; i < g.group; ++i) L[i] = pl[i];
    return best;
}

}  // namespace lowbit::quant
