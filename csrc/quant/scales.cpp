// The scale searches of ggml's k-quants and legacy imatrix quantizers, reimplemented for
// byte identity: same candidate scales, same accumulation order, same tie rules (a candidate
// replaces the best only when strictly better). Comments give the model each one fits.
#include <algorithm>

#include "common.h"

namespace lowbit::quant {

namespace {
// The weight of x under rmse_type when no importance weights are given.
inline float rmse_weight(int rmse_type, float x) {
    switch (rmse_type) {
        case 1: return x * x;
        case 2: return 1.f;
        case 3: return std::fabs(x);
        default: return std::sqrt(std::fabs(x));
    }
}
inline int clamp_i(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }
}  // namespace

// x ~ s * l with l in [-nmax, nmax-1], stored L = l + nmax. The first scale puts the value of
// largest magnitude at -nmax; with rmse_type > 0, 18 more scales -(nmax + 0.1 k)/max are
// tried and the one maximising (sum w x l)^2 / sum w l^2 wins.
float make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type, const float *qw) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < kGroupMaxEps) {
        std::memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = (float)(-nmax) / max;
    if (rmse_type == 0) {
        for (int i = 0; i < n; ++i) L[i] = (int8_t)(nmax + clamp_i(nearest_int(iscale * x[i]), -nmax, nmax - 1));
        return 1.f / iscale;
    }
    const bool return_early = rmse_type < 0;
    if (return_early) rmse_type = -rmse_type;
    // the weights once (the same values the search would compute per candidate)
    float wbuf[256];
    if (!qw && n <= 256) {
        for (int i = 0; i < n; ++i) wbuf[i] = rmse_weight(rmse_type, x[i]);
        qw = wbuf;
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_i(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = qw ? qw[i] : rmse_weight(rmse_type, x[i]);
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    if (return_early) return suml2 > 0 ? 0.5f * (scale + 1.f / iscale) : 1.f / iscale;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_i(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = qw ? qw[i] : rmse_weight(rmse_type, x[i]);
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) L[i] = (int8_t)(nmax + clamp_i(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// As make_qx_quants' first scale, then (do_rmse) up to 5 sweeps of coordinate descent: each
// code moves to the least-squares optimum given the others when that lowers the error.
float make_q3_quants(int n, int nmax, const float *x, int8_t *L, bool do_rmse) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < kGroupMaxEps) {
        std::memset(L, 0, (size_t)n);
        return 0.f;
    }
    const float iscale = (float)(-nmax) / max;
    if (!do_rmse) {
        for (int i = 0; i < n; ++i) L[i] = (int8_t)(clamp_i(nearest_int(iscale * x[i]), -nmax, nmax - 1) + nmax);
        return 1.f / iscale;
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_i(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                const int nl = clamp_i(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (nl != L[i]) {
                    slx += w * x[i] * (float)nl;
                    sl2 += w * (float)nl * (float)nl;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)nl; sumlx = slx; suml2 = sl2;
                        ++changed;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

namespace {
// The common body of qkx2 / qkx3: x ~ scale * L + min (min <= 0), L in [0, nmax]. Start from
// the range, then try nstep+1 scales (rmin + rdelta k + nmax) / (max - min), each with the
// weighted least-squares (scale, min) for its codes; keep the lowest weighted error
// (|diff| if use_mad, else diff^2). wsq: weights are x^2 when weights is null (qkx3).
template <bool kX3>
float make_qkx_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                      uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    auto wt = [&](int i) { return (kX3 && !weights) ? x[i] * x[i] : weights[i]; };
    float min = x[0], max = x[0];
    float sum_w = wt(0);
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = wt(i);
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (kX3 ? max <= min : max == min) {
        std::memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1.f / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        L[i] = (uint8_t)clamp_i(nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        best_error += wt(i) * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_i(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            const float w = wt(i);
            sum_l += w * (float)l;
            sum_l2 += w * (float)l * (float)l;
            sum_xl += w * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                diff = use_mad ? std::fabs(diff) : diff * diff;
                err += wt(i) * diff;
            }
            if (err < best_error) {
                std::memcpy(L, Laux, (size_t)n);
                best_error = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}
}  // namespace

float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                       uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    return make_qkx_quants<false>(n, nmax, x, weights, L, the_min, Laux, rmin, rdelta, nstep, use_mad);
}

float make_qkx3_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                       uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    return make_qkx_quants<true>(n, nmax, x, weights, L, the_min, Laux, rmin, rdelta, nstep, use_mad);
}

// Sub-block scales x >= 0 to L in [0, nmax]: the best of 9 scales (0.1 k + nmax) / max by
// weighted squared error, then least squares with up to 5 sweeps of coordinate descent.
float make_qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *quant_weights) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = cmax(max, x[i]);
    if (max < kGroupMaxEps) {
        std::memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = (float)nmax / max;
    for (int i = 0; i < n; ++i) L[i] = (uint8_t)nearest_int(iscale * x[i]);
    const float scale = 1.f / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; ++i) {
        const float diff = x[i] - scale * (float)L[i];
        best_mse += quant_weights[i] * diff * diff;
    }
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * (float)is + (float)nmax) / max;
        const float scale_is = 1.f / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; ++i) {
            const int l = std::min(nmax, nearest_int(iscale_is * x[i]));
            const float diff = x[i] - scale_is * (float)l;
            mse += quant_weights[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = std::min(nmax, nearest_int(iscale * x[i]));
        L[i] = (uint8_t)l;
        const float w = quant_weights[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = quant_weights[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            if (slx > 0 && sl2 > 0) {
                const int nl = std::min(nmax, nearest_int(x[i] * sl2 / slx));
                if (nl != L[i]) {
                    slx += w * x[i] * (float)nl;
                    sl2 += w * (float)nl * (float)nl;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)nl; sumlx = slx; suml2 = sl2;
                        ++changed;
                    }
                }
            }
        }
        if (!changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

}  // namespace lowbit::quant
