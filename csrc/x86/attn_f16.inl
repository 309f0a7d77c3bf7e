// The attention over a half KV cache (contracts: attn_f16_fn and mla_f16_fn in kernels.h; the
// spec is csrc/ref/attn.cpp), shared by csrc/x86/avx2/attn.cpp and csrc/x86/avx512/attn.cpp:
// included inside each level's anonymous namespace (built with that level's flags only), after
// attn_exp8.inl. The one-row kernel (attend_f16_simd) is the same code at both levels; the
// shared-rows kernel (mla_f16_simd<L>) takes from its level L the two inner loops that gain
// from wider vectors, L::scores8 (8 keys' scores for the live rows) and L::pv_rows (the values'
// sums), whose every lane is computed by the same operations at both levels (their headers).
//
// Same rounding points as the reference: q and each probability are rounded to half. What
// differs from the reference, in the last bits only: the q.K dots run 8 lanes wide with FMA
// and reduce in a fixed tree, and exp is a polynomial (exp8 below, <= 2 ulp). Every score,
// probability and output lane depends only on the query, the cache rows 0..len-1 and len,
// never on the window or the thread split (I2, I3): keys are grouped by 8 from key 0, and
// a lone key reduces in the same tree as a key inside a group of 8.
//
// Cost per key (head_dim 64): 8 FMAs for its score, one lane of an 8-wide exp, 8 FMAs for
// V; no horizontal sum per key (8 keys share one transpose-add) and the output accumulators
// of a 64-dim chunk stay in registers across all keys.

// 8 half cache values widened to float (exact).
inline __m256 load8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))); }
inline __m256 load8(const float *p) { return _mm256_loadu_ps(p); }

inline __m256 round_half8(__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }

// The score reduction of one key's 8-lane accumulator x: ((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7)).
// reduce8 computes exactly this tree for 8 keys at once (hadd pairs lanes within 128-bit
// halves; the halves are added last), so a key's score does not depend on its group.
inline float reduce1(__m256 a) {
    const __m256 t = _mm256_hadd_ps(a, a);
    const __m256 u = _mm256_hadd_ps(t, t);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
}

// Lane k of the result = reduce1(a_k).
inline __m256 reduce8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
    const __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
    const __m256 t2 = _mm256_hadd_ps(a4, a5), t3 = _mm256_hadd_ps(a6, a7);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    // u0 = [k0lo k1lo k2lo k3lo | k0hi k1hi k2hi k3hi], u1 likewise for keys 4..7
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Lane k of the result = reduce1(a_k), for 4 accumulators.
inline __m128 reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

// e^x for the softmax's x = score - max <= 0 (NaN stays NaN). Not the GLU's exp8.inl (ggml's
// method): with that one the I2_S-vs-TQ2_0 top-1 agreement of tests/test_bitnet.py fell below
// its 95% bound (35 of 37 near-tie positions), so the softmax keeps this one. x = n ln2 + r, |r| <= ln2/2
// (ln2 split in two so n ln2 is exact), e^r by its degree-6 Taylor polynomial (truncation
// <= 1.2e-7 relative), times 2^n built in the exponent field. Below -87.3 the result is
// flushed to 0 (e^-87.3 is FLT_MIN: no weight in a softmax).
inline __m256 exp8(__m256 x) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    const __m256i nn = _mm256_cvtps_epi32(_mm256_max_ps(n, _mm256_set1_ps(-126.0f)));
    const __m256 two_n = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(nn, _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(low, _mm256_mul_ps(p, two_n));
}

// The probabilities of one query row, in place: s[j] = half(e_j / sum) for j < len, e_j =
// exp(s_j - mx) (mx: the row's max score, its sink included), the sum in 8 lanes over the keys
// below len & ~7, then the tail keys in order, then the sink's exp (a sink of -inf: none).
inline void probs_half(float *s, int len, float mx, float sink) {
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    const int full = len & ~7;
    int j;
    for (j = 0; j < full; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx));
        _mm256_storeu_ps(s + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = reduce1(vsum);
    if (full < len) {
        alignas(32) float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (j = full; j < len; ++j) tail[j - full] = s[j] - mx;
        _mm256_store_ps(tail, exp8(_mm256_load_ps(tail)));
        for (j = full; j < len; ++j) { s[j] = tail[j - full]; sum += s[j]; }
    }
    if (sink > -INFINITY) sum += std::exp(sink - mx);  // and its exp the denominator, after the keys'
    const __m256 vinv = _mm256_set1_ps(1.0f / sum);
    for (j = 0; j < full; j += 8) _mm256_storeu_ps(s + j, round_half8(_mm256_mul_ps(_mm256_loadu_ps(s + j), vinv)));
    const float inv = 1.0f / sum;
    for (j = full; j < len; ++j) s[j] = _cvtsh_ss(_cvtss_sh(s[j] * inv, _MM_FROUND_TO_NEAREST_INT));
}

// out[d0 .. d0+8C) = sum_j p_j * V_j[d0 ..]: C output registers live across all keys, each
// lane summed over j in increasing order (the same order for any chunking of d).
template <int C>
inline void pv_chunk(const float *p, const uint16_t *V, int len, size_t kd, int d0, float *out) {
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    for (int j = 0; j < len; ++j) {
        const __m256 pj = _mm256_broadcast_ss(p + j);
        const uint16_t *v = V + (size_t)j * kd + d0;
        for (int c = 0; c < C; ++c) acc[c] = _mm256_fmadd_ps(pj, load8(v + 8 * c), acc[c]);
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + d0 + 8 * c, acc[c]);
}

// head_dim: a multiple of 8, at most 512 (the engine refuses other models). sc: len floats,
// holds the scores, then the half-rounded probabilities.
// One row against 8 keys k, k + kd, ..., k + 7 kd (f16 or float): lane i = key i, each key's
// products summed in d order, 8 lanes per key, then reduce8's tree.
template <class T>
inline __m256 scores_1x8(const float *qh, const T *k, int hd, size_t kd) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int d = 0; d < hd; d += 8) {
        const __m256 qv = _mm256_loadu_ps(qh + d);
        a0 = _mm256_fmadd_ps(qv, load8(k + d), a0);
        a1 = _mm256_fmadd_ps(qv, load8(k + kd + d), a1);
        a2 = _mm256_fmadd_ps(qv, load8(k + 2 * kd + d), a2);
        a3 = _mm256_fmadd_ps(qv, load8(k + 3 * kd + d), a3);
        a4 = _mm256_fmadd_ps(qv, load8(k + 4 * kd + d), a4);
        a5 = _mm256_fmadd_ps(qv, load8(k + 5 * kd + d), a5);
        a6 = _mm256_fmadd_ps(qv, load8(k + 6 * kd + d), a6);
        a7 = _mm256_fmadd_ps(qv, load8(k + 7 * kd + d), a7);
    }
    return reduce8(a0, a1, a2, a3, a4, a5, a6, a7);
}

[[maybe_unused]] void attend_f16_simd(const float *q, const uint16_t *K, const uint16_t *V, int len, int hd, size_t kd,
                     float scale, float sink, float softcap, float *sc, float *out) {
    alignas(32) float qr[512];
    for (int d = 0; d < hd; d += 8) _mm256_store_ps(qr + d, round_half8(_mm256_loadu_ps(q + d)));
    const __m256 vscale = _mm256_set1_ps(scale);

    // scores, 8 keys at a time
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= len; j += 8) {
        const __m256 s = _mm256_mul_ps(scores_1x8(qr, K + (size_t)j * kd, hd, kd), vscale);
        _mm256_storeu_ps(sc + j, s);
        vmax = _mm256_max_ps(vmax, s);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float mx = -INFINITY;
    for (int l = 0; l < 8; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
    for (; j < len; ++j) {
        const uint16_t *k = K + (size_t)j * kd;
        __m256 a = _mm256_setzero_ps();
        for (int d = 0; d < hd; d += 8) a = _mm256_fmadd_ps(_mm256_load_ps(qr + d), load8(k + d), a);
        sc[j] = reduce1(a) * scale;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    if (softcap > 0.0f) mx = softcap_scores8(sc, len, softcap);  // (the capped scores' max)
    mx = sink > mx ? sink : mx;  // an attention sink joins the max (none: -inf changes nothing)

    probs_half(sc, len, mx, sink);

    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) pv_chunk<8>(sc, V, len, kd, d0, out);
    for (; d0 < hd; d0 += 8) pv_chunk<1>(sc, V, len, kd, d0, out);
}

// DeepSeek MLA (contract: mla_f16_fn in kernels.h): the query rows (heads, and tokens in a prefill)
// share the cache rows, so a row is widened to float once and serves every query row. Per row
// the arithmetic is attend_f16_simd's: each (row, key) score is one 8-lane FMA accumulator over d
// reduced in reduce1's tree (reduce8 computes that tree for any 8 accumulators), the same exp8
// softmax and half-rounded probabilities, each output lane summed over keys in increasing order.
// A row that sees fewer keys than another of the call gets probability 0 for the keys beyond its
// own (0 * v adds nothing to a sum for finite v): its result does not depend on the other rows.
// Scores: the level's scores8 over each group of 8 keys; values: keys in blocks of KB (their
// rows stay in L1 / L2 while every row group and dim chunk reads them), L::kPvRows rows (the
// last ones together) per pass of the level's pv_rows.
constexpr int KB = 32;

// PF: also ask for the same dims of the row KB keys on (the next block's rows arrive while this
// block computes; the first row group of a block asks, the others find the lines in cache).
template <int HB, int DC, bool PF>
inline void mla_pv(const float *sc, size_t ld, const uint16_t *C, size_t kd, int j0, int j1, int d0, float *out, int dv) {
    __m256 acc[HB][DC];
    for (int h = 0; h < HB; ++h)
        for (int c = 0; c < DC; ++c) acc[h][c] = _mm256_loadu_ps(out + (size_t)h * dv + d0 + 8 * c);
    for (int j = j0; j < j1; ++j) {
        const uint16_t *v = C + (size_t)j * kd + d0;
        if constexpr (PF) _mm_prefetch((const char *)(v + (size_t)KB * kd), _MM_HINT_T0);
        __m256 vv[DC];
        for (int c = 0; c < DC; ++c) vv[c] = load8(v + 8 * c);
        for (int h = 0; h < HB; ++h) {
            const __m256 p = _mm256_broadcast_ss(sc + (size_t)h * ld + j);
            for (int c = 0; c < DC; ++c) acc[h][c] = _mm256_fmadd_ps(p, vv[c], acc[h][c]);
        }
    }
    for (int h = 0; h < HB; ++h)
        for (int c = 0; c < DC; ++c) _mm256_storeu_ps(out + (size_t)h * dv + d0 + 8 * c, acc[h][c]);
}

template <int HB, bool PF = false>
inline void mla_pv_rows(const float *sc, size_t ld, const uint16_t *C, size_t kd, int j0, int j1, float *out, int dv) {
    int d0 = 0;
    for (; d0 + 16 <= dv; d0 += 16) mla_pv<HB, 2, PF>(sc, ld, C, kd, j0, j1, d0, out, dv);
    for (; d0 < dv; d0 += 8) mla_pv<HB, 1, PF>(sc, ld, C, kd, j0, j1, d0, out, dv);
}

// the last 1 .. L::kPvRows - 1 rows of a call together (the level's pv_rows with HB = rest)
template <class L, bool PF>
inline void mla_pv_rest(int rest, const float *sc, size_t ld, const uint16_t *C, size_t kd, int j0, int j1, float *out, int dv) {
    switch (rest) {
        case 1: return L::template pv_rows<1, PF>(sc, ld, C, kd, j0, j1, out, dv);
        case 2: return L::template pv_rows<2, PF>(sc, ld, C, kd, j0, j1, out, dv);
        case 3: return L::template pv_rows<3, PF>(sc, ld, C, kd, j0, j1, out, dv);
        default: break;
    }
    if constexpr (L::kPvRows > 4) {
        switch (rest) {
            case 4: return L::template pv_rows<4, PF>(sc, ld, C, kd, j0, j1, out, dv);
            case 5: return L::template pv_rows<5, PF>(sc, ld, C, kd, j0, j1, out, dv);
            case 6: return L::template pv_rows<6, PF>(sc, ld, C, kd, j0, j1, out, dv);
            default: return L::template pv_rows<7, PF>(sc, ld, C, kd, j0, j1, out, dv);
        }
    }
}

template <class L>
void mla_f16_simd(const float *q, int nq, const int32_t *lens, const uint16_t *C, const uint16_t *V, int dk, int dv,
                  size_t kd, float scale, const float *sinks, float softcap, float *sc, float *out) {
    thread_local std::vector<float> qr, kf;
    thread_local std::vector<int32_t> live;
    int maxlen = 0;
    for (int r = 0; r < nq; ++r) maxlen = lens[r] > maxlen ? lens[r] : maxlen;
    const size_t ld = (size_t)maxlen;  // sc row stride
    qr.resize((size_t)nq * dk);
    kf.resize((size_t)8 * dk);
    for (size_t i = 0; i < (size_t)nq * dk; i += 8) _mm256_storeu_ps(qr.data() + i, round_half8(_mm256_loadu_ps(q + i)));
    const __m256 vscale = _mm256_set1_ps(scale);
    float *k8 = kf.data();
    // scores, 8 keys at a time (widened once for all rows that see any of them), then the last
    // keys one at a time; a row's lanes past its own length are computed and never used
    int j = 0;
    // (the key rows `ahead` keys on are asked for while these are widened: about kPrefetchAhead
    // bytes of a contiguous head's stream, at least the next group of 8)
    const int ahead = std::max<int>(8, (int)(kPrefetchAhead / (2 * (size_t)kd)) & ~7);
    int drop = 0;  // the shortest live row's length
    for (; j + 8 <= maxlen; j += 8) {
        if (j == 0 || j >= drop) {  // the rows that see keys j.. (anew only when one drops out)
            live.clear();
            drop = maxlen;
            for (int r = 0; r < nq; ++r)
                if (lens[r] > j) live.push_back(r), drop = std::min(drop, (int)lens[r]);
        }
        L::scores8(qr.data(), dk, live.data(), live.size(), C + (size_t)j * kd, kd, ahead, k8, sc + j, ld, vscale);
    }
    for (; j < maxlen; ++j) {
        for (int d = 0; d < dk; d += 8) _mm256_storeu_ps(k8 + d, load8(C + (size_t)j * kd + d));
        for (int r = 0; r < nq; ++r) {
            if (lens[r] <= j) continue;
            const float *qh = qr.data() + (size_t)r * dk;
            __m256 a = _mm256_setzero_ps();
            for (int d = 0; d < dk; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(k8 + d), a);
            sc[(size_t)r * ld + j] = reduce1(a) * scale;
        }
    }
    // softmax per row over its own keys (and its sink), as attend_f16_simd's; 0 past them
    for (int r = 0; r < nq; ++r) {
        const int len = lens[r], full = len & ~7;
        float *s = sc + (size_t)r * ld;
        if (softcap > 0.0f) softcap_scores8(s, len, softcap);
        __m256 vmax = _mm256_set1_ps(-INFINITY);
        for (j = 0; j < full; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, vmax);
        float mx = -INFINITY;
        for (int l = 0; l < 8; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
        for (j = full; j < len; ++j) mx = s[j] > mx ? s[j] : mx;
        const float sink = sinks ? sinks[r] : -INFINITY;
        mx = sink > mx ? sink : mx;  // an attention sink joins the max (none: -inf changes nothing)
        probs_half(s, len, mx, sink);
        for (j = len; j < maxlen; ++j) s[j] = 0.0f;
    }
    // values: out[r] = sum_j p_rj V_j[0..dv), keys in blocks of KB, rows by G = L::kPvRows
    // (each group up to its longest row)
    constexpr int G = L::kPvRows;
    for (size_t i = 0; i < (size_t)nq * dv; ++i) out[i] = 0.0f;
    for (int j0 = 0; j0 < maxlen; j0 += KB) {
        const int j1 = std::min(maxlen, j0 + KB);
        int r = 0;
        for (; r + G <= nq; r += G) {
            const int m = *std::max_element(lens + r, lens + r + G);
            if (m <= j0) continue;
            if (r == 0) L::template pv_rows<G, kPrefetchAhead != 0>(sc, ld, V, kd, j0, std::min(j1, m), out, dv);
            else L::template pv_rows<G, false>(sc + (size_t)r * ld, ld, V, kd, j0, std::min(j1, m), out + (size_t)r * dv, dv);
        }
        // the last 1 .. G-1 rows together (a GQA group of 3 or 2 heads at decode: each value row
        // widened once for them, not once per row; a row's sums are the same in any grouping)
        const int rest = nq - r;
        const int m = rest ? *std::max_element(lens + r, lens + nq) : 0;
        if (rest && m > j0) {
            const float *s = sc + (size_t)r * ld;
            float *o = out + (size_t)r * dv;
            if (r) mla_pv_rest<L, false>(rest, s, ld, V, kd, j0, std::min(j1, m), o, dv);
            else mla_pv_rest<L, kPrefetchAhead != 0>(rest, s, ld, V, kd, j0, std::min(j1, m), o, dv);  // (no full group asked)
        }
    }
}

