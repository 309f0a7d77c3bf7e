// Load-time repacked weight layouts: the same bytes as a GGUF tensor's rows, reordered so that
// a kernel reads several rows' values side by side. Built by the engine at load (Engine::set_mat)
// for the level whose kernels read them (kernels.h: KernelTable::r8), never stored in a file.
//
// Q4_K, 8 rows at a time ("R8"). Rows 8g .. 8g+7 of a matrix (rows a multiple of 8) occupy the
// same 8 * stride bytes as before, as nb = n / 256 groups of 1152 bytes (8 rows x 144), group b
// holding super-block b of each of the 8 rows j:
//   [0, 16)      fp16 d of rows 0..7                 [16, 32)   fp16 dmin of rows 0..7
//   [32, 64)     scale bytes 0..3 of rows 0..7 (4 bytes per row, row j at 4j)
//   [64, 96)     scale bytes 4..7 of rows 0..7       [96, 128)  scale bytes 8..11 of rows 0..7
//   [128, 1152)  for chunk c = 0..3, dword k = 0..7: qs[32c + 4k .. 32c + 4k + 3] of rows 0..7
//                (32 bytes at 128 + (8c + k) * 32, row j at 4j)
// So one 32-byte load is dword k of a chunk for 8 rows: its low nibbles are weights
// 64c + 4k .. +3 (sub-block 2c) and its high nibbles weights 64c + 32 + 4k .. +3 (sub-block
// 2c + 1), one int32 lane per row, the operand a dot product against one broadcast activation
// dword needs (csrc/x86/avx512/kq_r8.cpp). Nothing is added or dropped: the memory is the same.
//
// IQ4_XS, 8 rows at a time ("R8" too; csrc/x86/avx512/kq_r8.cpp). Rows 8g .. 8g+7 (rows a
// multiple of 8) occupy the same 8 * stride bytes as nb = n / 256 groups of 1088 bytes (8 rows x
// 136), group b holding super-block b of each of the 8 rows j:
//   [0, 16)      fp16 d of rows 0..7                 [16, 32)   uint16 scales_h of rows 0..7
//   [32, 64)     scales_l[0..3] of rows 0..7 (4 bytes per row, row j at 4j)
//   [64, 1088)   for sub-block s = 0..7, dword k = 0..3: qs[16s + 4k .. 16s + 4k + 3] of rows 0..7
//                (32 bytes at 64 + (4s + k) * 32, row j at 4j)
// So one 32-byte load is dword k of sub-block s for 8 rows: its low nibbles are weights 32s + 4k
// .. +3 and its high nibbles weights 32s + 16 + 4k .. +3, both of sub-block s (indices into
// kvalues_iq4nl), one int32 lane per row.
//
// Q4_0, Q4_1 and Q8_0, 8 rows x pairs of blocks ("R8" too; csrc/x86/avx512/lg_r8.cpp). Rows 8g ..
// 8g+7 (rows a multiple of 8, blocks per row even: n a multiple of 64) occupy the same 8 * stride
// bytes as nb / 2 groups of 16 blocks (16 x the block's bytes), group p holding blocks 2p and
// 2p + 1 of the 8 rows, LANE l = 2j + h for row j's block 2p + h:
//   [0, 32)     fp16 d of lane l at 2l            [32, 64)  fp16 m of lane l (Q4_1 only)
//   then for code dword k of the block (Q4_0 / Q4_1: the 4 dwords of qs[16]; Q8_0: the 8 of
//   qs[32]) 64 bytes, lane l's dword at 4l.
// So one 64-byte load is dword k of a pair of blocks for 8 rows: 16 int32 lanes, each the
// operand of a dot product against its block's activation dword k (the pair's two dwords
// broadcast as one qword).
#pragma once
#include <cstddef>
#include <cstdint>

namespace lowbit {

constexpr int kR8Rows = 8;
constexpr size_t kR8Group = 8 * 144;    // bytes of one super-block of 8 rows (Q4_K)
constexpr size_t kR8GroupQ5 = 8 * 176;  // (Q5_K)
constexpr size_t kR8Qh = 128;           // Q5_K: where the fifth bits start in a group
constexpr size_t kR8QsQ5 = 384;         // Q5_K: where the codes start in a group
constexpr size_t kR8GroupIq4xs = 8 * 136;  // (IQ4_XS)
constexpr size_t kR8QsIq4xs = 64;          // IQ4_XS: where the codes start in a group

// The formats with an R8 layout: Q4_K, Q5_K, Q4_0, Q4_1, Q8_0, IQ4_XS (ids, csrc/formats.h)
bool has_r8_layout(int type_id);
// Whether a matrix of that format and row width n can take it (the legacy formats' pairs of
// blocks need n a multiple of 64; rows a multiple of 8 are the caller's to check)
bool r8_takes(int type_id, int64_t n);
// rows [0, rows) of a matrix of format type_id (row r at w + r * stride, stride the format's
// bytes per row of n; r8_takes(type_id, n)), rows a multiple of 8, into out (the same size; not
// overlapping w).
void repack_r8(int type_id, const uint8_t *w, size_t stride, int64_t rows, int64_t n, uint8_t *out);
// Transparent huge pages: bytes from p (kHugePage-aligned) advised onto 2 MB pages (advice only: where
// THP is off, 4 KB pages). The repacked weights' buffers and the engine's KV cache (ZeroArray).
constexpr size_t kHugePage = (size_t)2 << 20;
void advise_huge_pages(void *p, size_t bytes);
// Memory for a repacked matrix (free it with std::free): 2 MB aligned and advised for
// transparent huge pages (the kernels stream it: 4 KB pages cost a TLB miss every 4 KB; numpy's
// arrays and a "hugepages" model copy are advised the same way).
uint8_t *alloc_repacked(size_t bytes);
// Row r of an R8 matrix (at r8, row stride `stride`) back into the format's own blocks.
void unpack_r8_row(int type_id, const uint8_t *r8, size_t stride, int64_t r, int64_t n, uint8_t *row);

}  // namespace lowbit
