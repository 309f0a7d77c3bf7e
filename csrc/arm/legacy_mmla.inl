// Legacy-format row kernels with SMMLA (the i8mm level): Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 x Q8_0 and
// Q4_1, Q5_1 x Q8_1. Body of csrc/arm/i8mm/legacy.cpp; the formats' decode and the reference's
// float step are legacy.inl's.
//
// SMMLA multiplies a 2x8 int8 matrix by the transpose of another: acc[i][j] += sum_k A[i][k] B[j][k].
// With A = 8 codes of tokens (t, t+1) and B = the same 8 positions of rows (r, r+1), one SMMLA
// adds 4 (token, row) dots of 8 products each; four of them cover a 32-weight block:
//   B_k = [row r codes 8k..8k+7 | row r+1 codes 8k..8k+7]     (zip of the two decoded rows)
//   A_k = [token t codes 8k..8k+7 | token t+1 codes 8k..8k+7]
//   isum lanes [(t, r), (t, r+1), (t+1, r), (t+1, r+1)], exact int32.
// Each lane then takes the reference's float step with its own d_w (row) and d_a (token), so the
// outputs are bitwise those of legacy.inl's kernels and of csrc/ref (I2, I3 as there). Rows go
// in pairs (a lone last row takes legacy.inl's SDOT kernel: the same numbers), tokens in pairs:
// acc0..acc3 hold token pairs (0,1) .. (6,7) (named registers, I7); an odd window's phantom
// token has zero codes and scales and is never stored.
#include "legacy.inl"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

LB_ARM_INLINE int8x16_t zip_lo(int8x16_t a, int8x16_t b) {
    return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}
LB_ARM_INLINE int8x16_t zip_hi(int8x16_t a, int8x16_t b) {
    return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}

// Two decoded rows of one block, zipped for SMMLA, and their scales as lanes [r, r+1, r, r+1].
struct Pair { int8x16_t b0, b1, b2, b3; float32x4_t d, m; };

// Tokens t, t+1 (t+1 present if TWO) of one block: lanes [(t,r), (t,r+1), (t+1,r), (t+1,r+1)].
template <class F, bool TWO>
LB_ARM_INLINE float32x4_t pair_step(const Pair &p, const uint8_t *at, size_t stride, float32x4_t acc) {
    constexpr int kQs = F::kAB - 32;
    const int8x16_t z = vdupq_n_s8(0);
    const int8x16_t x0 = vld1q_s8((const int8_t *)(at + kQs)), x1 = vld1q_s8((const int8_t *)(at + kQs + 16));
    const int8x16_t y0 = TWO ? vld1q_s8((const int8_t *)(at + stride + kQs)) : z;
    const int8x16_t y1 = TWO ? vld1q_s8((const int8_t *)(at + stride + kQs + 16)) : z;
    int32x4_t isum = vmmlaq_s32(vdupq_n_s32(0), zip_lo(x0, y0), p.b0);
    isum = vmmlaq_s32(isum, zip_hi(x0, y0), p.b1);
    isum = vmmlaq_s32(isum, zip_lo(x1, y1), p.b2);
    isum = vmmlaq_s32(isum, zip_hi(x1, y1), p.b3);
    // d_a lanes [t, t, t+1, t+1] (and s_a for the _1 formats)
    const float dt = f16(at), dt1 = TWO ? f16(at + stride) : 0.f;
    const float32x4_t da = vcombine_f32(vdup_n_f32(dt), vdup_n_f32(dt1));
    const float32x4_t t = vmulq_f32(vmulq_f32(p.d, da), vcvtq_f32_s32(isum));
    if constexpr (F::kM) {
        const float st = f16(at + 2), st1 = TWO ? f16(at + stride + 2) : 0.f;
        const float32x4_t sa = vcombine_f32(vdup_n_f32(st), vdup_n_f32(st1));
        return vaddq_f32(acc, vaddq_f32(t, vmulq_f32(p.m, sa)));
    } else {
        return vaddq_f32(acc, t);
    }
}

// Store lanes of token pair (t, t+1): lane 0 (t, r), 1 (t, r+1), 2 (t+1, r), 3 (t+1, r+1).
template <bool TWO>
LB_ARM_INLINE void store_pair(const RowArgs &a, int64_t r, int t, float32x4_t acc) {
    float *o = a.out + (size_t)t * a.out_stride + r;
    o[0] = vgetq_lane_f32(acc, 0);
    o[1] = vgetq_lane_f32(acc, 1);
    if (TWO) {
        o[a.out_stride] = vgetq_lane_f32(acc, 2);
        o[a.out_stride + 1] = vgetq_lane_f32(acc, 3);
    }
}

template <class F, int NT>
void rows_mmla(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    constexpr int P = (NT + 1) / 2;        // token pairs
    constexpr bool LAST_TWO = NT % 2 == 0;  // the last pair has both tokens
    const int64_t nb = a.n / F::kQK;
    const size_t st = a.act_stride;
    int64_t r = r0;
    for (; r + 1 < r1; r += 2) {
        const uint8_t *w0 = a.w + (size_t)r * a.w_stride, *w1 = w0 + a.w_stride;
        const float32x4_t z = vdupq_n_f32(0.f);
        float32x4_t acc0 = z, acc1 = z, acc2 = z, acc3 = z;
        for (int64_t b = 0; b < nb; ++b) {
            LegacyDec d0, d1;
            F::decode(w0 + (size_t)b * F::kWB, d0);
            F::decode(w1 + (size_t)b * F::kWB, d1);
            Pair p;
            p.b0 = zip_lo(d0.lo, d1.lo);
            p.b1 = zip_hi(d0.lo, d1.lo);
            p.b2 = zip_lo(d0.hi, d1.hi);
            p.b3 = zip_hi(d0.hi, d1.hi);
            const float32x2_t dd = vset_lane_f32(d1.d, vdup_n_f32(d0.d), 1);
            p.d = vcombine_f32(dd, dd);
            if constexpr (F::kM) {
                const float32x2_t mm = vset_lane_f32(d1.m, vdup_n_f32(d0.m), 1);
                p.m = vcombine_f32(mm, mm);
            }
            const uint8_t *ab = a.act + (size_t)b * F::kAB;
            acc0 = pair_step<F, (P > 1 || LAST_TWO)>(p, ab, st, acc0);
            if constexpr (P > 1) acc1 = pair_step<F, (P > 2 || LAST_TWO)>(p, ab + 2 * st, st, acc1);
            if constexpr (P > 2) acc2 = pair_step<F, (P > 3 || LAST_TWO)>(p, ab + 4 * st, st, acc2);
            if constexpr (P > 3) acc3 = pair_step<F, LAST_TWO>(p, ab + 6 * st, st, acc3);
        }
        store_pair<(P > 1 || LAST_TWO)>(a, r, 0, acc0);
        if constexpr (P > 1) store_pair<(P > 2 || LAST_TWO)>(a, r, 2, acc1);
        if constexpr (P > 2) store_pair<(P > 3 || LAST_TWO)>(a, r, 4, acc2);
        if constexpr (P > 3) store_pair<LAST_TWO>(a, r, 6, acc3);
    }
    if (r < r1) rows_nt<F, NT>(a, r, r1, nt);  // the lone last row: SDOT, the same numbers
}

template <class F>
void set_mmla(KernelTable &t, int id, const char *name) {
    KernelEntry &e = t.at(id);
    e.rows[1] = RowKernel{rows_nt<F, 1>, name, LOWBIT_ISA};  // one token: SMMLA would waste half
    e.rows[2] = RowKernel{rows_mmla<F, 2>, name, LOWBIT_ISA};
    e.rows[3] = RowKernel{rows_mmla<F, 3>, name, LOWBIT_ISA};
    e.rows[4] = RowKernel{rows_mmla<F, 4>, name, LOWBIT_ISA};
    e.rows[5] = RowKernel{rows_mmla<F, 5>, name, LOWBIT_ISA};
    e.rows[6] = RowKernel{rows_mmla<F, 6>, name, LOWBIT_ISA};
    e.rows[7] = RowKernel{rows_mmla<F, 7>, name, LOWBIT_ISA};
    e.rows[8] = RowKernel{rows_mmla<F, 8>, name, LOWBIT_ISA};
}

}  // namespace

void register_legacy_mmla(KernelTable &t) {
    set_mmla<Legacy<FQ4_0>>(t, T_Q4_0, "rows_q4_0_q8_0_" LB_ARM_SUFFIX);
    set_mmla<Legacy<FQ4_1>>(t, T_Q4_1, "rows_q4_1_q8_1_" LB_ARM_SUFFIX);
    set_mmla<Legacy<FQ5_0>>(t, T_Q5_0, "rows_q5_0_q8_0_" LB_ARM_SUFFIX);
    set_mmla<Legacy<FQ5_1>>(t, T_Q5_1, "rows_q5_1_q8_1_" LB_ARM_SUFFIX);
    set_mmla<Legacy<FQ8_0>>(t, T_Q8_0, "rows_q8_0_q8_0_" LB_ARM_SUFFIX);
    set_mmla<Legacy<FIQ4_NL>>(t, T_IQ4_NL, "rows_iq4_nl_q8_0_" LB_ARM_SUFFIX);
    set_mmla<Legacy<FMXFP4>>(t, T_MXFP4, "rows_mxfp4_q8_0_" LB_ARM_SUFFIX);
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
