// Load-time repacked layouts (csrc/repack.h): plain byte moves, built without ISA flags.
#include "repack.h"

#include "formats.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>

namespace lowbit {

// Where row j's pieces lie in an R8 group of a format, and in its own unit (a k-quant's
// super-block; a legacy format's pair of blocks) (repack.h).
struct R8Form {
    size_t sb, group, qh, qs;  // unit bytes; group bytes; the group's qh (0: none) and codes
    size_t src_qh, src_qs;     // the unit's qh (0: none) and codes
    int64_t per;               // weights per unit
    // legacy pairs: the block's bytes, whether it has an fp16 m after d, its code dwords
    size_t blk;
    bool m;
    int dwords;
    // a super-block's scale dwords after d and its second half (Q4_K, Q5_K: dmin and 3 dwords of
    // scales; IQ4_XS: scales_h and 1 dword of scales_l)
    int sdw;
};
static const R8Form *r8_form(int type_id) {
    static const R8Form q4{144, kR8Group, 0, 128, 0, 16, 256, 0, false, 0, 3},
        q5{176, kR8GroupQ5, kR8Qh, kR8QsQ5, 16, 48, 256, 0, false, 0, 3},
        iq4xs{136, kR8GroupIq4xs, 0, kR8QsIq4xs, 0, 8, 256, 0, false, 0, 1},
        q40{36, 16 * 18, 0, 32, 0, 2, 64, 18, false, 4, 0}, q41{40, 16 * 20, 0, 64, 0, 4, 64, 20, true, 4, 0},
        q80{68, 16 * 34, 0, 32, 0, 2, 64, 34, false, 8, 0};
    switch (type_id) {
        case T_Q4_K: return &q4;
        case T_Q5_K: return &q5;
        case T_IQ4_XS: return &iq4xs;
        case T_Q4_0: return &q40;
        case T_Q4_1: return &q41;
        case T_Q8_0: return &q80;
        default: return nullptr;
    }
}
bool has_r8_layout(int type_id) { return r8_form(type_id) != nullptr; }
bool r8_takes(int type_id, int64_t n) {
    const R8Form *f = r8_form(type_id);
    return f && n > 0 && n % f->per == 0;
}

// One unit of row j between its own bytes x and an R8 group o (to_group: x -> o)
static void r8_move(const R8Form &f, uint8_t *o, uint8_t *x, int j, bool to_group) {
    const auto mv = [&](size_t go, size_t xo, size_t n) {
        if (to_group) std::memcpy(o + go, x + xo, n);
        else std::memcpy(x + xo, o + go, n);
    };
    if (f.blk) {  // a legacy pair: block h of the pair in lane 2j + h
        for (int h = 0; h < 2; ++h) {
            const size_t l = (size_t)(2 * j + h), xb = (size_t)h * f.blk;
            mv(2 * l, xb, 2);                                              // d
            if (f.m) mv(32 + 2 * l, xb + 2, 2);                            // m
            for (int k = 0; k < f.dwords; ++k) mv(f.qs + (size_t)64 * k + 4 * l, xb + f.src_qs + 4 * (size_t)k, 4);
        }
        return;
    }
    mv((size_t)2 * j, 0, 2);                                                     // d
    mv(16 + (size_t)2 * j, 2, 2);                                                // dmin (IQ4_XS: scales_h)
    for (int i = 0; i < f.sdw; ++i) mv(32 + (size_t)32 * i + (size_t)4 * j, 4 + 4 * (size_t)i, 4);  // scale bytes 4i..
    if (f.qh)
        for (int k = 0; k < 8; ++k) mv(f.qh + (size_t)32 * k + (size_t)4 * j, f.src_qh + 4 * (size_t)k, 4);
    // code dword i (Q4_K / Q5_K: dword k of chunk c, i = 8c + k; IQ4_XS: dword k of sub-block s, i = 4s + k)
    for (int i = 0; i < 32; ++i) mv(f.qs + (size_t)i * 32 + (size_t)4 * j, f.src_qs + 4 * (size_t)i, 4);
}

void advise_huge_pages(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    madvise(p, (bytes + kHugePage - 1) / kHugePage * kHugePage, MADV_HUGEPAGE);
#else
    (void)p, (void)bytes;
#endif
}

uint8_t *alloc_repacked(size_t bytes) {
    const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void *p = std::aligned_alloc(kHugePage, size);
    if (!p) throw std::bad_alloc();
    advise_huge_pages(p, size);
    return static_cast<uint8_t *>(p);
}

void repack_r8(int type_id, const uint8_t *w, size_t stride, int64_t rows, int64_t n, uint8_t *out) {
    const R8Form &f = *r8_form(type_id);
    const int64_t nb = n / f.per;
    for (int64_t g = 0; g < rows / kR8Rows; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *o = out + (size_t)g * kR8Rows * stride + (size_t)b * f.group;
            for (int j = 0; j < kR8Rows; ++j)
                r8_move(f, o, const_cast<uint8_t *>(w) + (size_t)(g * kR8Rows + j) * stride + (size_t)b * f.sb, j, true);
        }
}

void unpack_r8_row(int type_id, const uint8_t *r8, size_t stride, int64_t r, int64_t n, uint8_t *row) {
    const R8Form &f = *r8_form(type_id);
    const int64_t nb = n / f.per;
    const int j = (int)(r % kR8Rows);
    const uint8_t *g = r8 + (size_t)(r - j) * stride;
    for (int64_t b = 0; b < nb; ++b)
        r8_move(f, const_cast<uint8_t *>(g) + (size_t)b * f.group, row + (size_t)b * f.sb, j, false);
}

}  // namespace lowbit
