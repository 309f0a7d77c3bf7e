// Load-time repacked layouts (csrc/repack.h): plain byte moves, built without ISA flags.
#include "repack.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>

namespace lowbit {

// Byte offsets within an R8 group of row j's pieces (repack.h).
static size_t r8_d(int j) { return (size_t)2 * j; }
static size_t r8_dmin(int j) { return 16 + (size_t)2 * j; }
static size_t r8_sc(int i, int j) { return 32 + (size_t)32 * i + (size_t)4 * j; }  // scale bytes 4i .. 4i+3
static size_t r8_qs(int c, int k, int j) { return 128 + (size_t)(8 * c + k) * 32 + (size_t)4 * j; }

uint8_t *alloc_repacked(size_t bytes) {
    constexpr size_t kHuge = 2u << 20;
    const size_t size = (bytes + kHuge - 1) / kHuge * kHuge;
    void *p = std::aligned_alloc(kHuge, size);
    if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE);  // (advice only: where THP is off, 4 KB pages)
#endif
    return static_cast<uint8_t *>(p);
}

void repack_q4_k_r8(const uint8_t *w, size_t stride, int64_t rows, int64_t n, uint8_t *out) {
    const int64_t nb = n / 256;
    for (int64_t g = 0; g < rows / kR8Rows; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *o = out + (size_t)g * kR8Rows * stride + (size_t)b * kR8Group;
            for (int j = 0; j < kR8Rows; ++j) {
                const uint8_t *x = w + (size_t)(g * kR8Rows + j) * stride + (size_t)b * 144;
                std::memcpy(o + r8_d(j), x, 2);
                std::memcpy(o + r8_dmin(j), x + 2, 2);
                for (int i = 0; i < 3; ++i) std::memcpy(o + r8_sc(i, j), x + 4 + 4 * i, 4);
                for (int c = 0; c < 4; ++c)
                    for (int k = 0; k < 8; ++k) std::memcpy(o + r8_qs(c, k, j), x + 16 + 32 * c + 4 * k, 4);
            }
        }
}

void unpack_q4_k_r8_row(const uint8_t *r8, size_t stride, int64_t r, int64_t n, uint8_t *row) {
    const int64_t nb = n / 256;
    const int j = (int)(r % kR8Rows);
    const uint8_t *g = r8 + (size_t)(r - j) * stride;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *o = g + (size_t)b * kR8Group;
        uint8_t *x = row + (size_t)b * 144;
        std::memcpy(x, o + r8_d(j), 2);
        std::memcpy(x + 2, o + r8_dmin(j), 2);
        for (int i = 0; i < 3; ++i) std::memcpy(x + 4 + 4 * i, o + r8_sc(i, j), 4);
        for (int c = 0; c < 4; ++c)
            for (int k = 0; k < 8; ++k) std::memcpy(x + 16 + 32 * c + 4 * k, o + r8_qs(c, k, j), 4);
    }
}

}  // namespace lowbit
