// Building the grid indexes of iq_grid.h from the dequantization grids (csrc/ref/iq_tables.h).
#include "iq_grid.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "../formats.h"
#include "../ref/iq_tables.h"

namespace lowbit::quant {

namespace {

// points[size]: each point `group` bytes, little-endian in a uint64/uint32 (as iq_tables.h
// packs them). nwant: how many distinct distances the neighbour lists keep (ggml: 2 for
// IQ2_XXS/IQ2_XS and IQ3_XXS, 1 for IQ2_S, 3 for IQ1 and IQ3_S).
template <typename P>
GridIndex build(const P *points, int size, int group, int bits, int nwant) {
    GridIndex g;
    g.group = group;
    g.bits = bits;
    g.size = size;

    // the grid's distinct byte values, as signed (IQ1's are -1/0/+1), in ascending order
    std::vector<int8_t> values;
    for (int p = 0; p < size; ++p)
        for (int i = 0; i < group; ++i) values.push_back((int8_t)(points[p] >> 8 * i));
    std::sort(values.begin(), values.end());
    values.erase(std::unique(values.begin(), values.end()), values.end());
    const int nlevels = (int)values.size();
    if (nlevels > (1 << bits)) throw std::logic_error("iq grid: more levels than a key holds");

    g.level.resize((size_t)size * group);
    g.map.assign((size_t)1 << (bits * group), 0);
    std::vector<bool> on_grid(g.map.size(), false);
    for (int p = 0; p < size; ++p) {
        uint32_t key = 0;
        for (int i = 0; i < group; ++i) {
            const int8_t v = (int8_t)(points[p] >> 8 * i);
            const int l = (int)(std::lower_bound(values.begin(), values.end(), v) - values.begin());
            g.level[(size_t)p * group + i] = (int8_t)l;
            key |= (uint32_t)l << (bits * i);
        }
        g.map[key] = p;
        on_grid[key] = true;
    }
    g.odd.resize(g.level.size());
    for (size_t i = 0; i < g.level.size(); ++i) g.odd[i] = (float)(2 * g.level[i] + 1);

    // Neighbour lists of the keys whose levels are all < nlevels (the searches clamp every
    // level into that range, so no other key is ever looked up). Distances are small
    // integers: bucket them, then take every point of the nwant nearest distances in
    // (distance, index) order -- the order ggml's qsort of (distance, index) pairs gives.
    const int maxd = group * (2 * (nlevels - 1)) * (2 * (nlevels - 1));
    std::vector<int> dist(size), count(maxd + 1);
    std::vector<int> lv(group);
    for (uint32_t key = 0; key < g.map.size(); ++key) {
        if (on_grid[key]) continue;
        bool valid = true;
        for (int i = 0; i < group; ++i) {
            lv[i] = (int)(key >> (bits * i)) & ((1 << bits) - 1);
            valid = valid && lv[i] < nlevels;
        }
        if (!valid) {
            g.map[key] = -1 - (int32_t)0x7fffffff;  // never looked up
            continue;
        }
        std::fill(count.begin(), count.end(), 0);
        for (int p = 0; p < size; ++p) {
            const int8_t *pl = g.point(p);
            int d2 = 0;
            for (int i = 0; i < group; ++i) {
                const int diff = (2 * pl[i] + 1) - (2 * lv[i] + 1);
                d2 += diff * diff;
            }
            dist[p] = d2;
            ++count[d2];
        }
        const size_t at = g.neighbours.size();
        g.map[key] = -(int32_t)at - 1;
        g.neighbours.push_back(0);
        int have = 0;
        for (int d = 0; d <= maxd && have < nwant; ++d) {
            if (!count[d]) continue;
            ++have;
            for (int p = 0; p < size; ++p)
                if (dist[p] == d) g.neighbours.push_back((uint16_t)p);
        }
        g.neighbours[at] = (uint16_t)(g.neighbours.size() - at - 1);
    }
    return g;
}

}  // namespace

const GridIndex &grid_index(int id) {
    switch (id) {
    case T_IQ2_XXS: { static const GridIndex g = build(iq::iq2xxs_grid, 256, 8, 2, 2); return g; }
    case T_IQ2_XS:  { static const GridIndex g = build(iq::iq2xs_grid, 512, 8, 2, 2); return g; }
    case T_IQ2_S:   { static const GridIndex g = build(iq::iq2s_grid, 1024, 8, 2, 1); return g; }
    case T_IQ1_S:
    case T_IQ1_M:   { static const GridIndex g = build(iq::iq1s_grid, 2048, 8, 2, 3); return g; }
    case T_IQ3_XXS: { static const GridIndex g = build(iq::iq3xxs_grid, 256, 4, 3, 2); return g; }
    case T_IQ3_S:   { static const GridIndex g = build(iq::iq3s_grid, 512, 4, 3, 3); return g; }
    default: throw std::invalid_argument("grid_index: not a grid i-quant");
    }
}

}  // namespace lowbit::quant
