// lowbit_check: the kernels of the levels built to the reference's arithmetic (aarch64 neon,
// dotprod, i8mm; x86 avx) against the scalar reference, bitwise, no Python.
//
// Built by CMake with -DLOWBIT_PYTHON=OFF (tools/test_arm.sh cross-compiles it for aarch64 and
// runs it under qemu-aarch64 at each level; natively, `LOWBIT_MAX_ISA=avx lowbit_check` checks
// avx, which .ci/run covers through the Python kernel tests under that cap). For each
// such level this CPU runs (LOWBIT_MAX_ISA caps it, as in the package) and each format of
// kFormats the level covers:
//   coverage   the level's table has a SIMD kernel (not the scalar one) for every window 1..8
//              and for each activation quantizer;
//   I4         the activation quantizers are byte-identical to the reference's, on random rows
//              and on the edge rows (zeros, ties, denormals, +-inf, NaN, FLT_MAX);
//   exact      row outputs bitwise equal to the reference's, window sizes 1..8 at two offsets,
//              odd shapes, random bytes and worst-case bytes (I1: all codes maximal or minimal
//              against activations of +-127); float rows: within 1e-6 of the largest |output|;
//   I2         a token's output in any window equals its output alone, bitwise;
//   I3         a split row range gives the full range's output bitwise and leaves the rows
//              outside untouched;
//   GLU, attn  the level's GLU epilogue and attention over a half cache (aarch64) bitwise the
//              reference's, edge values included;
//   attn_q     attention over a quantized KV cache (aarch64): every K (Q8_0, Q4_0) x V (F16, Q8_0,
//              Q4_0) pairing, odd lengths around the kernels' groups of 4 and 8 keys, sinks,
//              scales large enough to flush exps to 0, worst-case codes; bitwise the reference;
//   MLA        DeepSeek's latent attention (aarch64): several query rows of unequal lengths per
//              call, odd dk / dv, bitwise the reference, and each row bitwise its result alone.
// Prints each failure with its worst (row, token) and ends with "N passed, M failed"; exit 1
// on any failure. --expect-best LEVEL also checks that the probe found that level (qemu -cpu).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../csrc/dispatch.h"
#include "../../csrc/fp16.h"

using namespace lowbit;

namespace {

int g_pass = 0, g_fail = 0;

void check(bool ok, const std::string &what) {
    if (ok) {
        ++g_pass;
    } else {
        ++g_fail;
        std::printf("FAIL %s\n", what.c_str());
    }
}

std::mt19937_64 g_rng(20261202);
float unif(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g_rng); }
float normal() { return std::normal_distribution<float>(0.f, 1.f)(g_rng); }

// The formats under test and where their fp16 / float scales are (random bytes elsewhere);
// e8m0: where an e8m0 scale byte is (MXFP4's block start).
struct Fmt { int id; std::vector<int> f16_scales; std::vector<int> e8m0 = {}; };
const std::vector<Fmt> kFormats = {
    {T_Q4_0, {0}}, {T_Q4_1, {0, 2}}, {T_Q5_0, {0}}, {T_Q5_1, {0, 2}}, {T_Q8_0, {0}}, {T_IQ4_NL, {0}},
    {T_Q2_K, {80, 82}}, {T_Q3_K, {108}}, {T_Q4_K, {0, 2}}, {T_Q5_K, {0, 2}}, {T_Q6_K, {208}},
    {T_IQ4_XS, {0}}, {T_TQ1_0, {52}}, {T_TQ2_0, {64}}, {T_I2_S, {}}, {T_MXFP4, {}, {0}},
    {T_F32, {}}, {T_F16, {}}, {T_BF16, {}},
};
const int kActs[] = {T_Q8_0, T_Q8_1, T_Q8_K, T_I8_S};

bool is_float(int id) { return id == T_F32 || id == T_F16 || id == T_BF16; }

// The levels built to the reference's arithmetic (bitwise): the aarch64 levels and x86's avx.
// (avx2 and up accumulate in another float order, within I5: tests/test_*_simd.py check them.)
bool reference_arithmetic(int isa) { return isa == ISA_AVX || isa == ISA_NEON || isa == ISA_DOTPROD || isa == ISA_I8MM; }
// The formats a level has kernels for: every one of kFormats on aarch64; avx leaves the ternary
// formats and IQ4_XS to the reference.
bool covered(int isa, int id) {
    if (isa != ISA_AVX) return true;
    return id != T_IQ4_XS && id != T_TQ1_0 && id != T_TQ2_0 && id != T_I2_S;
}

void put16(uint8_t *p, uint16_t v) { std::memcpy(p, &v, 2); }

// Weight bytes of `rows` rows of n values. pattern < 0: random; else every code byte = pattern
// and every scale 1.0 (the worst case of I1 with pattern 0xFF / 0x00).
std::vector<uint8_t> make_weights(const Fmt &f, int rows, int64_t n, int pattern) {
    const Format *F = format_by_id(f.id);
    const size_t rb = row_bytes(F, n);
    std::vector<uint8_t> w(rb * rows + tensor_pad(F));
    if (is_float(f.id)) {
        for (size_t i = 0; i < (size_t)rows * n; ++i) {
            const float v = pattern < 0 ? normal() : (pattern ? 1.5f : -1.0f);
            if (f.id == T_F32) std::memcpy(&w[4 * i], &v, 4);
            else if (f.id == T_F16) put16(&w[2 * i], f32_to_fp16(v));
            else put16(&w[2 * i], (uint16_t)(f32_to_bits(v) >> 16));
        }
        return w;
    }
    for (auto &b : w) b = pattern < 0 ? (uint8_t)g_rng() : (uint8_t)pattern;
    const size_t nblocks = rb * rows / F->bytes;
    for (size_t b = 0; b < nblocks; ++b)
        for (int off : f.f16_scales)
            put16(&w[b * F->bytes + off], f32_to_fp16(pattern < 0 ? unif(-0.05f, 0.05f) : 1.0f));
    // e8m0 bytes: 2^(e - 128) (ref::e8m0_half); random: mostly near 1, sometimes the denormal
    // scales (e = 0, 1) and the smallest normal; worst case: e = 128, the scale 1
    static const uint8_t kEdgeE[] = {0, 1, 2, 118, 138};
    for (size_t b = 0; b < nblocks; ++b)
        for (int off : f.e8m0)
            w[b * F->bytes + off] = pattern >= 0 ? 128 : g_rng() % 8 == 0 ? kEdgeE[g_rng() % 5] : (uint8_t)(120 + g_rng() % 17);
    return w;
}

// nt tokens of activations in format act for n values; pattern 0: random, +-1: all codes +-127.
std::vector<uint8_t> make_acts(int act, int nt, int64_t n, int pattern, size_t &stride) {
    const Format *A = format_by_id(act);
    stride = row_bytes(A, n);
    std::vector<uint8_t> out(stride * nt);
    std::vector<float> x(n);
    const quant_act_fn q = kernel_entry_at(act, ISA_SCALAR).quant_act.fn;
    for (int t = 0; t < nt; ++t) {
        uint8_t *dst = &out[stride * t];
        if (pattern == 0 || act == T_F32) {
            const float s = std::exp(unif(-3.f, 3.f));
            for (auto &v : x) v = pattern == 0 ? normal() * s : 127.f * pattern;
            q(x.data(), dst, n);
            continue;
        }
        // worst case: every code 127 * pattern, scales 1
        const int8_t c = (int8_t)(127 * pattern);
        if (act == T_I8_S) {
            const float one = 1.f;
            const int32_t sum = c * (int32_t)n;
            std::memcpy(dst, &one, 4);
            std::memcpy(dst + 4, &sum, 4);
            std::memset(dst + 8, (uint8_t)c, n);
        } else if (act == T_Q8_K) {
            for (int64_t b = 0; b < n / QK_K; ++b) {
                uint8_t *p = dst + b * sizeof(block_q8_K);
                const float one = 1.f;
                std::memcpy(p, &one, 4);
                std::memset(p + 4, (uint8_t)c, QK_K);
                for (int j = 0; j < 16; ++j) {
                    const int16_t s = (int16_t)(16 * c);
                    std::memcpy(p + 4 + QK_K + 2 * j, &s, 2);
                }
            }
        } else {
            const bool q81 = act == T_Q8_1;
            const size_t bb = q81 ? sizeof(block_q8_1) : sizeof(block_q8_0);
            for (int64_t b = 0; b < n / QK; ++b) {
                uint8_t *p = dst + b * bb;
                put16(p, 0x3C00);  // 1.0
                if (q81) put16(p + 2, f32_to_fp16(32.f * c));
                std::memset(p + (q81 ? 4 : 2), (uint8_t)c, QK);
            }
        }
    }
    return out;
}

std::string lv(int isa) { return isa_name(isa); }

void run(const RowKernel &k, const uint8_t *w, size_t ws, const uint8_t *act, size_t as, float *out, size_t os,
         int64_t n, float wsc, int64_t r0, int64_t r1, int nt) {
    RowArgs a{w, ws, act, as, out, os, n, wsc};
    k.fn(a, r0, r1, nt);
}

const float kSentinel = -12345.678f;

// One format, one level, one shape and one input pattern: exact / I2 / I3.
void check_rows(int isa, const Fmt &f, int rows, int64_t n, int wpat, int apat) {
    const Format *F = format_by_id(f.id);
    const int act = F->act, T = 11;
    const std::vector<uint8_t> w = make_weights(f, rows, n, wpat);
    size_t as;
    const std::vector<uint8_t> A = make_acts(act, T, n, apat, as);
    const size_t ws = row_bytes(F, n);
    const float wsc = f.id == T_I2_S ? 0.73f : 1.0f;
    const KernelEntry &ref = kernel_entry_at(f.id, ISA_SCALAR), &e = kernel_entry_at(f.id, isa);
    std::vector<float> R((size_t)T * rows), alone((size_t)T * rows);
    for (int t = 0; t < T; ++t) run(ref.rows[1], w.data(), ws, &A[as * t], as, &R[(size_t)t * rows], rows, n, wsc, 0, rows, 1);
    for (int t = 0; t < T; ++t) run(e.rows[1], w.data(), ws, &A[as * t], as, &alone[(size_t)t * rows], rows, n, wsc, 0, rows, 1);
    const std::string tag = lv(isa) + " " + F->name + " rows=" + std::to_string(rows) + " n=" + std::to_string(n) +
                            (wpat < 0 ? " random" : " worst w=" + std::to_string(wpat) + " a=" + std::to_string(apat));
    float scale = 0.f;
    for (float v : R) scale = std::fmax(scale, std::fabs(v));
    // exact (or, for float rows, within 1e-6 of the largest output), every window
    for (int nt = 1; nt <= MAX_NT; ++nt)
        for (int t0 : {0, T - nt}) {
            std::vector<float> out((size_t)nt * rows, kSentinel);
            run(e.rows[nt], w.data(), ws, &A[as * t0], as, out.data(), rows, n, wsc, 0, rows, nt);
            double worst = 0;
            int wr = -1, wt = -1;
            bool same = true, same_alone = true;
            for (int t = 0; t < nt; ++t)
                for (int r = 0; r < rows; ++r) {
                    const float o = out[(size_t)t * rows + r], x = R[(size_t)(t0 + t) * rows + r];
                    const float al = alone[(size_t)(t0 + t) * rows + r];
                    if (f32_to_bits(o) != f32_to_bits(x)) {  // remember the worst differing (row, token)
                        double d = std::fabs((double)o - (double)x);
                        if (std::isnan(d)) d = INFINITY;
                        if (wr < 0 || d > worst) worst = d, wr = r, wt = t;
                    }
                    same &= f32_to_bits(o) == f32_to_bits(x);
                    same_alone &= f32_to_bits(o) == f32_to_bits(al);
                }
            const bool ok = is_float(f.id) ? worst <= 1e-6 * scale : same;
            char buf[256] = "";
            if (!ok && wr >= 0)
                std::snprintf(buf, sizeof buf, " worst row %d token %d: %.9g vs reference %.9g (max |ref| %.6g)", wr,
                              t0 + wt, out[(size_t)wt * rows + wr], R[(size_t)(t0 + wt) * rows + wr], scale);
            check(ok, tag + " nt=" + std::to_string(nt) + " t0=" + std::to_string(t0) + ": " +
                          (is_float(f.id) ? "within 1e-6 of the reference" : "bitwise the reference") + buf);
            check(same_alone, tag + " nt=" + std::to_string(nt) + " t0=" + std::to_string(t0) + ": I2 window == alone");
        }
    // I3: [0, k) + [k, rows) == [0, rows); [1, rows - 1) leaves rows 0 and rows - 1 alone
    for (int nt : {3, 8}) {
        std::vector<float> full((size_t)nt * rows, kSentinel), split((size_t)nt * rows, kSentinel),
            inner((size_t)nt * rows, kSentinel);
        run(e.rows[nt], w.data(), ws, A.data(), as, full.data(), rows, n, wsc, 0, rows, nt);
        const int k = rows / 3;
        run(e.rows[nt], w.data(), ws, A.data(), as, split.data(), rows, n, wsc, 0, k, nt);
        run(e.rows[nt], w.data(), ws, A.data(), as, split.data(), rows, n, wsc, k, rows, nt);
        bool ok = std::memcmp(full.data(), split.data(), full.size() * 4) == 0;
        if (rows > 2) {
            run(e.rows[nt], w.data(), ws, A.data(), as, inner.data(), rows, n, wsc, 1, rows - 1, nt);
            for (int t = 0; t < nt; ++t)
                for (int r = 0; r < rows; ++r) {
                    const float v = inner[(size_t)t * rows + r];
                    ok &= (r == 0 || r == rows - 1) ? v == kSentinel : f32_to_bits(v) == f32_to_bits(full[(size_t)t * rows + r]);
                }
        }
        check(ok, tag + " nt=" + std::to_string(nt) + ": I3 split invariance, rows outside untouched");
    }
}

// I4: the level's quantizer against the reference's, byte for byte.
void check_quant(int isa, int act) {
    const Format *A = format_by_id(act);
    const KernelEntry &ref = kernel_entry_at(act, ISA_SCALAR), &e = kernel_entry_at(act, isa);
    std::vector<std::vector<float>> rowsv;
    const int64_t n = 3 * QK_K;
    for (int k = 0; k < 6; ++k) {  // random rows at several magnitudes
        std::vector<float> x(n);
        const float s = std::exp(unif(-20.f, 20.f));
        for (auto &v : x) v = normal() * s;
        rowsv.push_back(x);
    }
    const float edge[] = {0.f, -0.f, 0.5f, -0.5f, 1.5f, 2.5f, 63.5f, 127.f, -127.f, 1e-40f, -1e-39f, 1.2e-38f,
                          3.4e38f, -3.4e38f, INFINITY, -INFINITY, NAN, -NAN, 1e-45f, 2.5e-37f};
    for (int k = 0; k < 8; ++k) {  // edge rows: mixtures of the edge values, blocks of one value
        std::vector<float> x(n);
        for (int64_t i = 0; i < n; ++i) {
            const int pick = (int)(g_rng() % (sizeof(edge) / sizeof(edge[0])));
            x[i] = k < 4 ? edge[pick] : (i % 7 == 0 ? edge[pick] : normal());
        }
        if (k == 7) std::fill(x.begin(), x.begin() + QK_K, 0.f);
        if (k == 6) for (int64_t i = 0; i < n; ++i) x[i] = (float)((i % 255) - 127) / 2.f;  // ties
        rowsv.push_back(x);
    }
    std::vector<int64_t> lens = {n};
    if (act == T_I8_S) lens = {1, 7, 131, n};  // I8_S rows are any length
    for (int64_t len : lens)
        for (size_t k = 0; k < rowsv.size(); ++k) {
            const size_t rb = row_bytes(A, len);
            std::vector<uint8_t> a(rb, 0), b(rb, 0);
            ref.quant_act.fn(rowsv[k].data(), a.data(), len);
            e.quant_act.fn(rowsv[k].data(), b.data(), len);
            size_t at = 0;
            while (at < rb && a[at] == b[at]) ++at;
            char buf[160] = "";
            if (at < rb) std::snprintf(buf, sizeof buf, ": first difference at byte %zu: %02x vs reference %02x", at, b[at], a[at]);
            check(at == rb, lv(isa) + " quant_act " + A->name + " row " + std::to_string(k) + " n=" +
                                std::to_string(len) + " byte-identical to the reference" + buf);
        }
}

// The GLU epilogue: the level's against the reference's, bitwise, both kinds, odd lengths,
// edge values (exp's range ends, NaN, +-inf, denormals), out aliasing g.
void check_glu(int isa) {
    const GluKernel &ref = kernel_table(ISA_SCALAR).glu, &k = kernel_table(isa).glu;
    const float edge[] = {0.f, -0.f, 88.7f, -88.7f, 89.f, -104.f, 133.f, -133.f, 200.f, -200.f, 1e-40f, -1e-40f,
                          INFINITY, -INFINITY, NAN, 3.4e38f, -3.4e38f, 0.5f, -17.f};
    for (int kind : {(int)GLU_SILU, (int)GLU_RELU2})
        for (int64_t n : {1, 3, 4, 7, 64, 257}) {
            std::vector<float> g(n), u(n), a(n), b(n);
            for (int64_t i = 0; i < n; ++i) {
                g[i] = i % 3 == 0 ? edge[g_rng() % (sizeof(edge) / sizeof(edge[0]))] : normal() * 8.f;
                u[i] = normal();
            }
            ref.fn(g.data(), u.data(), a.data(), n, kind);
            k.fn(g.data(), u.data(), b.data(), n, kind);
            std::vector<float> c(g);
            k.fn(c.data(), u.data(), c.data(), n, kind);  // out aliases g
            const bool ok = std::memcmp(a.data(), b.data(), n * 4) == 0 && std::memcmp(a.data(), c.data(), n * 4) == 0;
            int64_t at = 0;
            while (at < n && f32_to_bits(a[at]) == f32_to_bits(b[at])) ++at;
            char buf[160] = "";
            if (at < n) std::snprintf(buf, sizeof buf, ": first difference at %lld: g %.9g -> %.9g vs reference %.9g",
                                      (long long)at, g[at], b[at], a[at]);
            check(ok, lv(isa) + " " + k.name + " kind " + std::to_string(kind) + " n=" + std::to_string(n) +
                          " bitwise the reference" + buf);
        }
}

// Attention over a half KV cache: the level's against the reference's, bitwise (aarch64).
void check_attn(int isa) {
    const AttnKernel &ref = kernel_table(ISA_SCALAR).attn, &k = kernel_table(isa).attn;
    for (int hd : {64, 80, 128})
        for (int len : {1, 3, 4, 9, 37}) {
            const size_t kd = (size_t)hd + 16;
            std::vector<uint16_t> K(kd * len), V(kd * len);
            for (auto &h : K) h = f32_to_fp16(normal());
            for (auto &h : V) h = f32_to_fp16(normal());
            std::vector<float> q(hd), sa(len), sb(len), a(hd), b(hd);
            for (auto &v : q) v = normal() * 2.f;
            for (float sink : {-INFINITY, 0.7f, 40.f})  // none, a sink among the scores, a dominant one
                for (float cap : {0.f, 1.5f}) {          // no softcap, Gemma 2's (scores past the cap)
                    ref.fn(q.data(), K.data(), V.data(), len, hd, kd, 0.125f, sink, cap, sa.data(), a.data());
                    k.fn(q.data(), K.data(), V.data(), len, hd, kd, 0.125f, sink, cap, sb.data(), b.data());
                    check(std::memcmp(a.data(), b.data(), hd * 4) == 0,
                          lv(isa) + " " + k.name + " hd=" + std::to_string(hd) + " len=" + std::to_string(len) +
                              " sink=" + std::to_string(sink) + " softcap=" + std::to_string(cap) + " bitwise the reference");
                }
        }
}

// Attention over a quantized KV cache: the level's against the reference's, bitwise (aarch64).
void check_attn_q(int isa) {
    const AttnQKernel &ref = kernel_table(ISA_SCALAR).attnq, &k = kernel_table(isa).attnq;
    const quant_act_fn q8 = kernel_entry_at(T_Q8_0, ISA_SCALAR).quant_act.fn;
    auto row_bytes_of = [](int type, int hd) {
        return type == T_F16 ? (size_t)2 * hd : (size_t)(hd / QK) * (type == T_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0));
    };
    // len rows of `type` at stride st: random codes (or all 0xFF / 0x77 bytes: codes at an
    // extreme), block scales random (or 1), halves normal
    auto cache = [&](int type, int hd, int len, size_t st, int worst) {
        std::vector<uint8_t> c(st * len + 64);
        for (auto &b : c) b = worst ? (uint8_t)worst : (uint8_t)g_rng();
        for (int j = 0; j < len; ++j) {
            uint8_t *row = &c[st * j];
            if (type == T_F16) {
                for (int d = 0; d < hd; ++d) put16(row + 2 * d, f32_to_fp16(worst ? 2.f : normal()));
                continue;
            }
            const size_t bb = type == T_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
            for (int b = 0; b < hd / QK; ++b) put16(row + b * bb, f32_to_fp16(worst ? 1.f : unif(-0.1f, 0.1f)));
        }
        return c;
    };
    for (int kt : {(int)T_Q8_0, (int)T_Q4_0})
        for (int vt : {(int)T_F16, (int)T_Q8_0, (int)T_Q4_0})
            for (int hd : {32, 96, 128})
                for (int len : {1, 3, 4, 7, 8, 9, 13, 37})
                    for (int worst : {0, 0x77, 0xFF}) {
                        if (worst && (hd != 96 || (len != 9 && len != 37))) continue;
                        const size_t ks = row_bytes_of(kt, hd) + 6, vs = row_bytes_of(vt, hd) + 10;
                        const std::vector<uint8_t> K = cache(kt, hd, len, ks, worst), V = cache(vt, hd, len, vs, worst);
                        std::vector<float> q(hd);
                        for (auto &v : q) v = worst ? 3.f : normal() * 2.f;
                        std::vector<uint8_t> qq((size_t)(hd / QK) * sizeof(block_q8_0));
                        q8(q.data(), qq.data(), hd);
                        std::vector<float> sa(len), sb(len), a(hd), b(hd);
                        for (float scale : {0.125f, 6.f})  // 6: most exps flush to 0 (score gaps > 87.3)
                            for (float sink : {-INFINITY, 0.7f, 40.f}) {
                                const float cap = scale == 6.f && sink == 0.7f ? 20.f : 0.f;  // (Gemma 2's softcap once)
                                ref.fn(qq.data(), kt, K.data(), ks, vt, V.data(), vs, len, hd, scale, sink, cap, sa.data(), a.data());
                                k.fn(qq.data(), kt, K.data(), ks, vt, V.data(), vs, len, hd, scale, sink, cap, sb.data(), b.data());
                                int at = 0;
                                while (at < hd && f32_to_bits(a[at]) == f32_to_bits(b[at])) ++at;
                                char buf[128] = "";
                                if (at < hd) std::snprintf(buf, sizeof buf, ": out[%d] %.9g vs reference %.9g", at, b[at], a[at]);
                                check(at == hd, lv(isa) + " " + k.name + " K " + format_by_id(kt)->name + " V " +
                                                    format_by_id(vt)->name + " hd=" + std::to_string(hd) + " len=" +
                                                    std::to_string(len) + " scale=" + std::to_string(scale) + " sink=" +
                                                    std::to_string(sink) + " softcap=" + std::to_string(cap) +
                                                    (worst ? " worst " + std::to_string(worst) : "") +
                                                    " bitwise the reference" + buf);
                            }
                    }
}

// DeepSeek MLA over a half latent cache: the level's against the reference's, bitwise, and each
// query row bitwise its result alone (aarch64).
void check_mla(int isa) {
    const MlaKernel &ref = kernel_table(ISA_SCALAR).mla, &k = kernel_table(isa).mla;
    struct Shape { int dk, dv; };
    for (Shape sh : {Shape{72, 64}, Shape{37, 30}, Shape{576, 512}})
        for (int nq : {1, 2, 3, 5, 8})
            for (int maxlen : {1, 4, 7, 70}) {
                if (sh.dk == 576 && maxlen == 70 && nq > 3) continue;  // (time under qemu)
                const size_t kd = (size_t)sh.dk + 8;
                std::vector<uint16_t> C(kd * maxlen), Vs(kd * maxlen);
                for (auto &h : C) h = f32_to_fp16(normal());
                for (auto &h : Vs) h = f32_to_fp16(normal());
                // MLA (values = the keys' rows, no sinks) and a GQA group (values apart, a sink per row)
                const bool gqa = maxlen % 2 == 0;
                const uint16_t *V = gqa ? Vs.data() : C.data();
                std::vector<float> sinks(nq);
                for (auto &v : sinks) v = normal() * 2.f;
                const float *sk = gqa ? sinks.data() : nullptr;
                std::vector<int32_t> lens(nq);
                for (int r = 0; r < nq; ++r) lens[r] = r == nq / 2 ? maxlen : 1 + (int)(g_rng() % maxlen);
                std::vector<float> q((size_t)nq * sh.dk), sc((size_t)nq * maxlen), a((size_t)nq * sh.dv), b(a);
                for (auto &v : q) v = normal() * 2.f;
                const float scale = 0.1f;
                const float cap = gqa && nq % 2 ? 2.f : 0.f;  // a GQA group with Gemma 2's softcap (some)
                ref.fn(q.data(), nq, lens.data(), C.data(), V, sh.dk, sh.dv, kd, scale, sk, cap, sc.data(), a.data());
                k.fn(q.data(), nq, lens.data(), C.data(), V, sh.dk, sh.dv, kd, scale, sk, cap, sc.data(), b.data());
                bool alone = true;
                for (int r = 0; r < nq; ++r) {
                    std::vector<float> o(sh.dv);
                    k.fn(&q[(size_t)r * sh.dk], 1, &lens[r], C.data(), V, sh.dk, sh.dv, kd, scale, sk ? sk + r : nullptr,
                         cap, sc.data(), o.data());
                    alone &= std::memcmp(o.data(), &b[(size_t)r * sh.dv], sh.dv * 4) == 0;
                }
                size_t at = 0;
                while (at < a.size() && f32_to_bits(a[at]) == f32_to_bits(b[at])) ++at;
                char buf[128] = "";
                if (at < a.size()) std::snprintf(buf, sizeof buf, ": out[%zu] %.9g vs reference %.9g", at, b[at], a[at]);
                const std::string tag = lv(isa) + " " + k.name + " dk=" + std::to_string(sh.dk) + " dv=" +
                                        std::to_string(sh.dv) + " nq=" + std::to_string(nq) + " maxlen=" + std::to_string(maxlen) + (gqa ? " (V, sinks)" : "") +
                                        (cap > 0 ? " softcap" : "");
                check(at == a.size(), tag + " bitwise the reference" + buf);
                check(alone, tag + ": each row bitwise its result alone");
            }
}

}  // namespace

int main(int argc, char **argv) {
    std::string expect;
    for (int i = 1; i < argc; ++i)
        if (std::strcmp(argv[i], "--expect-best") == 0 && i + 1 < argc) expect = argv[++i];
    const CpuInfo &c = cpu_info();
    std::printf("lowbit_check: %s, best %s, cap %s, selected %s\n", c.model.c_str(), isa_name(c.best),
                isa_name(c.cap), isa_name(c.selected));
    if (!expect.empty()) check(expect == isa_name(c.best), "the probe finds " + expect + " (found " + isa_name(c.best) + ")");
    for (int isa : isa_ladder()) {
        if (!reference_arithmetic(isa) || !level_available(isa)) continue;
        const int p0 = g_pass, f0 = g_fail;
        for (int act : kActs) {
            const KernelEntry &e = kernel_entry_at(act, isa);
            check(e.quant_act.fn && e.quant_act.isa != ISA_SCALAR,
                  lv(isa) + " has a SIMD quantizer for " + format_by_id(act)->name);
            check_quant(isa, act);
        }
        if (isa != ISA_AVX)  // (avx leaves the GLU to the reference)
            check(kernel_table(isa).glu.isa != ISA_SCALAR, lv(isa) + " has a SIMD GLU epilogue");
        if (kernel_table(isa).glu.isa != ISA_SCALAR) check_glu(isa);
        if (isa != ISA_AVX)  // (avx leaves attention to the reference)
            check(kernel_table(isa).attn.isa != ISA_SCALAR, lv(isa) + " has a SIMD attention kernel");
        if (kernel_table(isa).attn.isa != ISA_SCALAR) check_attn(isa);
        if (isa != ISA_AVX) {  // (avx leaves the quantized-cache and MLA attention to the reference)
            check(kernel_table(isa).attnq.isa != ISA_SCALAR, lv(isa) + " has a SIMD quantized-cache attention kernel");
            check(kernel_table(isa).mla.isa != ISA_SCALAR, lv(isa) + " has a SIMD MLA attention kernel");
        }
        if (kernel_table(isa).attnq.isa != ISA_SCALAR) check_attn_q(isa);
        if (kernel_table(isa).mla.isa != ISA_SCALAR) check_mla(isa);
        for (const Fmt &f : kFormats) {
            if (!covered(isa, f.id)) continue;
            const Format *F = format_by_id(f.id);
            bool simd = true;
            for (int nt = 1; nt <= MAX_NT; ++nt) simd &= kernel_entry_at(f.id, isa).rows[nt].isa != ISA_SCALAR;
            check(simd, lv(isa) + " has SIMD row kernels for " + F->name + " (" +
                            kernel_entry_at(f.id, isa).rows[1].name + ")");
            std::vector<int64_t> ns;
            if (is_float(f.id)) ns = {1, 7, 64, 259};
            else if (F->block == QK) ns = {32, 96, 288, 1056};
            else if (F->block == QK_I2S) ns = {128, 384, 1152};
            else ns = {256, 768, 1280};
            for (int rows : {1, 5, 13})
                for (int64_t n : ns) check_rows(isa, f, rows, n, -1, 0);
            // all codes at one extreme: 0xFF / 0x00 are every format's code extremes except
            // MXFP4's (nibble 15 = -12, 7 = +12; 0 is the value 0)
            const std::vector<int> worst = f.id == T_MXFP4 ? std::vector<int>{0xFF, 0x77} : std::vector<int>{0xFF, 0x00};
            for (int wpat : worst)
                for (int apat : {1, -1}) check_rows(isa, f, 3, ns.back(), wpat, apat);
        }
        std::printf("level %s: %d passed, %d failed\n", isa_name(isa), g_pass - p0, g_fail - f0);
    }
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
