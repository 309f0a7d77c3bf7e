// The lattice grids of the i-quants with grid searches (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
// IQ1_S, IQ1_M) as their quantizers search them: each grid point as small integer levels, a
// map from a point's key to its grid index, and for every key that is not a grid point the
// list of grid points nearest to it. This is what ggml's iq2xs_init_impl / iq3xs_init_impl
// build at init; here it is built from the dequantization grids of csrc/ref/iq_tables.h (one
// source of truth), once, at first use (thread-safe: a function-local static).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace lowbit::quant {

struct GridIndex {
    int group = 0;  // values per grid point: 8 (IQ2, IQ1) or 4 (IQ3)
    int bits = 0;   // bits per value in a key: 2 (IQ2, IQ1) or 3 (IQ3)
    int size = 0;   // grid points
    // level[p * group + i]: value i of grid point p as a level 0..nlevels-1 (the rank of its
    // byte among the grid's distinct bytes: IQ2 8/25/43 -> 0/1/2, IQ1 -1/0/+1 -> 0/1/2,
    // IQ3 -> 0..7). ggml's search works on the odd integers 2*level + 1.
    std::vector<int8_t> level;
    std::vector<float> odd;  // odd[p * group + i] = 2 * level + 1, the search's values as floats
    // map[key], key = sum(level_i << bits*i): the grid point with that key, or -(o + 1) where
    // neighbours[o] = count and neighbours[o + 1 .. o + count] are the grid points nearest to
    // the key (squared distance of the 2*level + 1 vectors; every point at the nwant smallest
    // distances, ordered by distance, then index). Keys with a level >= nlevels never occur.
    std::vector<int32_t> map;
    std::vector<uint16_t> neighbours;

    const int8_t *point(int p) const { return level.data() + (size_t)p * group; }
    const float *odd_point(int p) const { return odd.data() + (size_t)p * group; }
    // the neighbour list of an off-grid key: count, then grid indices
    const uint16_t *near(uint32_t key) const { return neighbours.data() + (-map[key] - 1); }
};

// The grid of a format id (T_IQ2_XXS, T_IQ2_XS, T_IQ2_S, T_IQ3_XXS, T_IQ3_S, T_IQ1_S/T_IQ1_M).
const GridIndex &grid_index(int id);

}  // namespace lowbit::quant
