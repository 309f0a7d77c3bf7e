// The kernel API every ISA level implements, and the kernel table filled once at import.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "formats.h"

namespace lowbit {

// One row kernel call: out[t * out_stride + r] = dot(W[r], act[t]) for r in [r0, r1),
// t < nt, nt in 1..8 (callers chunk larger windows).
//   W[r]   = w + r * w_stride           raw GGUF bytes of row r (n weights)
//   act[t] = act + t * act_stride       token t, already in the paired activation format
//   w_scale                             per-tensor scale (I2_S), 1.0f for every other format
// Contract (DESIGN.md): I2 a token's result never depends on nt; I3 rows outside
// [r0, r1) are untouched and a row's result does not depend on the split.
struct RowArgs {
    const uint8_t *w;
    size_t w_stride;
    const uint8_t *act;
    size_t act_stride;
    float *out;
    size_t out_stride;
    int64_t n;
    float w_scale;
    // Nonzero: names the activations of one matmul call (new_act_id, csrc/matmul.h): calls with
    // the same id, pointer, stride, n and nt read the same bytes, so a GEMM may reuse the
    // activation panel it built for the first of them (each thread builds it once per call,
    // not once per row part or GLU tile), and the legacy window kernels their re-layout
    // (csrc/x86/legacy.inl, prepare). 0: no promise.
    uint64_t act_id = 0;
};

// What a thread's buffer derived from a call's activations holds (a GEMM's panel, a window
// kernel's re-layout): act_holds(k, a, nt, layout) is true when a names the same activations
// (non-zero act_id, pointer, stride, n) for the same nt and layout (an id of the buffer's
// format, for a buffer several layouts share; nullptr for one buffer per layout), so the
// buffer can be reused; otherwise k records a and the caller rebuilds.
struct ActKey {
    uint64_t id = 0;
    const uint8_t *act = nullptr;
    size_t stride = 0;
    int64_t n = 0;
    int nt = 0;
    const void *layout = nullptr;
};
inline bool act_holds(ActKey &k, const RowArgs &a, int nt, const void *layout = nullptr) {
    const bool hit = a.act_id != 0 && k.id == a.act_id && k.act == a.act && k.stride == a.act_stride && k.n == a.n &&
                     k.nt == nt && k.layout == layout;
    k = ActKey{a.act_id, a.act, a.act_stride, a.n, nt, layout};
    return hit;
}
using rows_fn = void (*)(const RowArgs &a, int64_t r0, int64_t r1, int nt);

// Dequantize one row of n weights (n a multiple of the block) into float32.
// (I2_S: w_scale is applied by the caller's row view; the dequantized value is
//  code-1 times w_scale, see dequantize_tensor in bindings.)
using dequant_fn = void (*)(const uint8_t *src, float *dst, int64_t n, float w_scale);

// Quantize one row of n float32 activations into an activation format, byte-identical
// to ggml's from_float for Q8_0 / Q8_1 / Q8_K (invariant I4).
using quant_act_fn = void (*)(const float *x, uint8_t *dst, int64_t n);

// Quantize rows of float32 weights into a weight format (formats that have our own
// quantizer: I2_S). Writes the whole tensor (rows * n values) including any pad.
using quant_w_fn = void (*)(const float *x, uint8_t *dst, int64_t rows, int64_t n);

// ISA levels. Each level's sources are built with its own flags. The ids are stable names
// (tests and counters index by them), NOT the order: a build has one architecture's ladder,
// lowest to highest (isa_ladder(): x86 scalar avx avx2 avx2vnni avx512 amx; aarch64 scalar neon
// dotprod i8mm), and "above" / "below" always mean positions in that ladder (isa_rank).
enum Isa : int {
    ISA_SCALAR = 0,
    ISA_AVX2 = 1, ISA_AVX2VNNI = 2, ISA_AVX512 = 3,  // x86 (AVX2+FMA+F16C and up)
    ISA_AVX = 4,                                      // x86: AVX without AVX2/FMA/F16C (Sandy Bridge)
    ISA_NEON = 5, ISA_DOTPROD = 6, ISA_I8MM = 7,      // aarch64: armv8-a, +dotprod, +i8mm
    ISA_AMX = 8,                                      // x86: avx512 + AMX-TILE / AMX-INT8 (the GEMM tier's tiles)
    ISA_COUNT = 9
};
const char *isa_name(int isa);
// Position of isa in this build's ladder (0 = scalar); -1 if isa belongs to another architecture.
int isa_rank(int isa);

constexpr int MAX_NT = 8;
// The wide window (KernelEntry::wide): 16 tokens per pass over a row, where a level has one.
constexpr int WIDE_NT = 16;
constexpr int MAX_TYPE_ID = 1024 + 8;

// One slot of the kernel table: the function a level registered, its name (what `lowbit info`
// and the counters print, and what LOWBIT_NO_<NAME>=1 turns off) and the level it belongs to.
// Every kind of kernel (row kernels, GEMMs, attention, GLU, delta-net) is a KernelSlot of its
// function type.
template <class Fn>
struct KernelSlot {
    Fn fn = nullptr;
    const char *name = nullptr;  // e.g. "rows_q4_0_q8_0_scalar", "attn_f16_avx2"
    int isa = ISA_SCALAR;
};
using RowKernel = KernelSlot<rows_fn>;

struct KernelEntry {
    RowKernel rows[MAX_NT + 1];       // indexed by nt (1..8)
    // Optional wide window: the row-kernel contract at nt = WIDE_NT, each row decoded once per
    // 16 tokens rather than once per 8, bitwise the rows[] kernels' per-token results (I2).
    // A chunk that takes no GEMM goes WIDE_NT tokens at a time through it while at least
    // WIDE_NT remain, the rest in windows of <= 8 (next_window). Counted as nt = 16.
    RowKernel wide;
    // Optional GEMM for a prompt chunk: the row-kernel contract with any nt >= 1 (the kernel
    // tiles tokens itself), bitwise the row kernels' result per token (I2) and per row (I3).
    // run_rows calls it once per row tile for the whole token range when nt >= gemm_min_nt
    // (set by the registering level from its measurements; 0 = never). Counted as nt = 0.
    RowKernel gemm;
    int gemm_min_nt = 0;
    // The GEMM's tokens per lane vector (its passes run whole vectors, a chunk's last one padded)
    // and the longest tail it leaves to the windows: a chunk of nt tokens whose last
    // nt % gemm_lanes tokens are at most gemm_tail runs the rest through the GEMM and those
    // through the windows (gemm_tokens), each token bitwise as either tier alone would give it
    // (I8). 0: the GEMM takes every token of its chunks.
    int gemm_lanes = 0, gemm_tail = 0;
    // The rows the GEMM computes at once (the amx level: groups of 16, its tiles' rows; else 1): a
    // dispatch's parts start on multiples of it where the rows allow (gemm_align), so that no
    // part computes a group mostly past its rows.
    int gemm_rows = 1;
    // A level's GEMM that beats the level below's only from gemm_cross tokens (the amx level,
    // measured per format): a chunk whose GEMM tokens are fewer runs the level below's GEMM,
    // gemm_low, kept by the dispatcher's overlay (gemm_kernel); bitwise the same either way (I8).
    // 0: no crossover (this GEMM from gemm_min_nt).
    RowKernel gemm_low;
    int gemm_cross = 0;
    dequant_fn dequant = nullptr;
    // The id the call counters file this entry's calls under, when it is not the format's: a
    // repacked layout's entry (KernelTable::r8) counts apart from its format's own.
    int count_id = -1;
    KernelSlot<quant_act_fn> quant_act;  // activation formats: e.g. "quant_act_q8_0_avx2"
    quant_w_fn quant_w = nullptr;
};

// The window that takes a chunk's next tokens when no GEMM does: WIDE_NT tokens (e.wide) or
// up to MAX_NT (e.rows[]); `left` tokens remain. Both matrices of a fused GLU take the same
// windows (glu_window).
inline int next_window(const KernelEntry &e, int64_t left) {
    if (e.wide.fn && left >= WIDE_NT) return WIDE_NT;
    return left < MAX_NT ? (int)left : MAX_NT;
}
inline int glu_window(const KernelEntry &g, const KernelEntry &u, int64_t left) {
    const int a = next_window(g, left), b = next_window(u, left);
    return a == b ? a : (int)(left < MAX_NT ? left : MAX_NT);
}
// How many of a chunk's nt tokens (from its first) the GEMM takes: 0 (below its gate: the
// windows take the chunk), nt, or nt less a tail of <= gemm_tail tokens that the windows take
// (a padded lane vector of the GEMM costs as much as a whole one; a short window less).
inline int64_t gemm_tokens(const KernelEntry &e, int64_t nt) {
    if (!e.gemm.fn || e.gemm_min_nt <= 0 || nt < e.gemm_min_nt) return 0;
    const int64_t tail = e.gemm_lanes > 0 ? nt % e.gemm_lanes : 0;
    return tail > 0 && tail <= e.gemm_tail && nt - tail >= e.gemm_min_nt ? nt - tail : nt;
}
// The GEMM that runs a chunk's nt GEMM tokens (gemm_tokens' answer): the entry's own, or below
// its crossover the level below's; and the level to count the call under (the selected level
// `isa`, or the level below's where its GEMM ran: the counters name the kernel that ran).
inline const RowKernel &gemm_kernel(const KernelEntry &e, int64_t nt) {
    return e.gemm_low.fn && nt < e.gemm_cross ? e.gemm_low : e.gemm;
}
inline int gemm_level(const KernelEntry &e, int64_t nt, int isa) {
    return &gemm_kernel(e, nt) == &e.gemm_low ? e.gemm_low.isa : isa;
}
// The same for a fused gate / up pair (glu_rows): both take the same tokens through their
// GEMMs, or (their tails disagree) all of them, or neither a GEMM.
inline int64_t glu_gemm_tokens(const KernelEntry &g, const KernelEntry &u, int64_t nt) {
    const int64_t a = gemm_tokens(g, nt), b = gemm_tokens(u, nt);
    return a == b ? a : a && b ? nt : 0;
}
// The kernel of a window of ntc tokens (next_window's answer).
inline const RowKernel &window_kernel(const KernelEntry &e, int ntc) { return ntc > MAX_NT ? e.wide : e.rows[ntc]; }

// A level's row kernel templated on its window: rows[nt] = make(std::integral_constant<int, nt>)
// for nt = 1..MAX_NT, all under one name, e.g.
//   set_rows_each_nt(t.at(T_Q4_0), "rows_q4_0_q8_0_avx", ISA_AVX,
//                    [](auto nt) { return &rows_nt<FQ4_0, decltype(nt)::value>; });
template <class Make, int... I>
void set_rows_each_nt(KernelEntry &e, const char *name, int isa, Make make, std::integer_sequence<int, I...>) {
    ((e.rows[I + 1] = RowKernel{make(std::integral_constant<int, I + 1>{}), name, isa}), ...);
}
template <class Make>
void set_rows_each_nt(KernelEntry &e, const char *name, int isa, Make make) {
    set_rows_each_nt(e, name, isa, make, std::make_integer_sequence<int, MAX_NT>{});
}

// The table, indexed by type id. Filled once (dispatch.cpp); read-only afterwards.
const KernelEntry &kernel_entry(int type_id);
// How the IQ3 kernels fetch their 8 grid rows per 32 weights: true = 8 scalar loads and
// inserts (AMD: its ymm gather is microcode, IQ3_XXS nt = 1 0.16 vs 0.21 us per row of 2560 on
// Zen 5), false = one vpgatherdd (Intel Xeon: 0.21 vs 0.26 for IQ3_S). LOWBIT_IQ_GRID=loads or
// gather overrides it. Read once; safe to call while the kernel table is being filled.
bool iq_grid_by_loads();

// Each level's registration function overwrites the entries it implements.
// The call counters' ids of the R8 layouts' kernels (KernelTable::r8): not formats
// (format_by_id knows nothing of them); lowbit.kernels.stats() names their calls by their
// format, with the R8 kernels' names. kR8Formats[i] is the format of id kR8FirstId + i.
constexpr int kR8FirstId = 1002;
constexpr int kR8Formats[] = {T_Q4_K, T_Q5_K, T_Q4_0, T_Q4_1, T_Q8_0, T_IQ4_XS};
constexpr int kR8Layouts = (int)(sizeof(kR8Formats) / sizeof(kR8Formats[0]));
constexpr int kQ4kR8Id = kR8FirstId, kQ5kR8Id = kR8FirstId + 1;
constexpr int kQ4_0R8Id = kR8FirstId + 2, kQ4_1R8Id = kR8FirstId + 3, kQ8_0R8Id = kR8FirstId + 4;
constexpr int kIq4xsR8Id = kR8FirstId + 5;
// The R8 layout's id of a format, or -1; and the format of an R8 id (else the id itself)
constexpr int r8_id(int type_id) {
    for (int i = 0; i < kR8Layouts; ++i)
        if (kR8Formats[i] == type_id) return kR8FirstId + i;
    return -1;
}
constexpr bool is_r8_id(int id) { return id >= kR8FirstId && id < kR8FirstId + kR8Layouts; }
constexpr int r8_format(int id) { return is_r8_id(id) ? kR8Formats[id - kR8FirstId] : id; }
// The selected level's entry for a matrix of this format in its repacked layout, or nullptr
// (no such layout for the format here).
const KernelEntry *repacked_entry(int type_id);
// The id a call of entry e on a matrix of format f is counted under (count_call).
inline int count_id(int format_id, const KernelEntry &e) { return e.count_id >= 0 ? e.count_id : format_id; }

struct KernelTable;
void register_scalar(KernelTable &t);
void register_avx2(KernelTable &t);      // csrc/x86/avx2/register.cpp (AVX2+FMA+F16C, no VNNI)
void register_avx2vnni(KernelTable &t);  // csrc/x86/avx2vnni/register.cpp (AVX-VNNI, 256-bit)
void register_avx512(KernelTable &t);    // csrc/x86/avx512/register.cpp (F/BW/VL/DQ/VNNI)
void register_avx(KernelTable &t);       // csrc/x86/avx/register.cpp (AVX + SSE4.1, no AVX2/FMA/F16C)
// csrc/x86/amx/register.cpp (avx512 + AMX-TILE/INT8: GEMMs; with bf16, AMX-BF16: BF16's rows)
void register_amx_hw(KernelTable &t, bool bf16);
namespace amx_emu {
void register_gemm(KernelTable &t);      // csrc/x86/avx2/gemm_amx.cpp (the amx GEMMs, emulated tiles)
void register_bf16(KernelTable &t);      // csrc/x86/avx2/bf16_amx.cpp (BF16's rows, emulated tiles)
}
void register_neon(KernelTable &t);      // csrc/arm/neon/register.cpp (armv8-a Advanced SIMD)
void register_dotprod(KernelTable &t);   // csrc/arm/dotprod/register.cpp (+ SDOT/UDOT)
void register_i8mm(KernelTable &t);      // csrc/arm/i8mm/register.cpp (+ SMMLA)

// Attention of one query row against a half KV cache (the engine's default):
//   q[hd] (float, rounded to half before its dots), K/V rows j < len at K + j*kd (half bits),
//   out[hd] = sum_j softmax(scale * q.K_j)_j (rounded to half) * V_j;  sc: scratch of len floats.
//   sink: an attention sink (gpt-oss): a logit with no value row that takes part in the
//   softmax's max and denominator, p_j = e^(s_j - m) / (sum_i e^(s_i - m) + e^(sink - m)),
//   m = max(max_j s_j, sink). -INFINITY: none (the results are bitwise those without it).
//   softcap: > 0 caps every score s_j = scale * q.K_j before the softmax (Gemma 2's attention logit
//   soft-capping, below); 0: none. Every attention kernel takes it the same way.
// A query row's result never depends on the other rows of its window (I2).
using attn_f16_fn = void (*)(const float *q, const uint16_t *K, const uint16_t *V, int len, int hd, size_t kd,
                             float scale, float sink, float softcap, float *sc, float *out);

// Gemma 2's attention logit soft-capping of the scores, in place, as ggml's steps (llama.cpp's graph
// scales q.k by 1 / cap, takes tanh and scales by cap; its flash attention folds 1 / cap into the
// score scale, the same product when the score scale is 1, as Gemma 2's is):
//   s_j = cap * T(s_j * (1 / cap)),  T(x) = copysign((1 - e) / (1 + e), x),  e = attn_exp(-2|x|)
// (the spec: ref::softcap_scores in csrc/ref/attn.cpp). T is tanh to within 1.2e-7 absolute (libm's
// tanhf, which llama.cpp runs, to within a few ulp of 1): plain IEEE mul / add / div, so every level
// computes the same bits, 8 lanes at a time on x86 (csrc/x86/attn_exp8.inl).
using AttnKernel = KernelSlot<attn_f16_fn>;

// Attention of nq query rows that share one half cache's key and value rows: DeepSeek MLA
// (csrc/mla.cpp: the heads of one or several tokens against the slot's latent rows, K = V, as
// llama.cpp's absorbed MLA) and the heads of one GQA group (Engine::attention: K and V apart):
//   q[nq][dk] (float, rounded to half before its dots); row r sees rows j < lens[r]: the key is
//   the first dk halves at K + j*kd, the value the first dv at V + j*kd (dv <= kd, dk <= kd);
//   out[r][dv] = sum_{j < lens[r]} softmax_j(scale * q_r.K_j[0..dk)) (rounded to half) * V_j[0..dv);
//   sinks: null, or sinks[r] the attention sink of row r (as attn_f16_fn's sink); softcap as attn_f16_fn's.
//   sc: scratch of nq * max(lens) floats. Each row's result is what attn_f16_fn computes on it
//   alone with hd = dk for the scores and dv for the values, bitwise, whichever rows share the
//   call (I2, I3): a token's logits do not depend on its chunk or the threads. The rows of one
//   call read each cache row once for all of them. Cache values must be finite.
using mla_f16_fn = void (*)(const float *q, int nq, const int32_t *lens, const uint16_t *K, const uint16_t *V, int dk,
                            int dv, size_t kd, float scale, const float *sinks, float softcap, float *sc, float *out);
using MlaKernel = KernelSlot<mla_f16_fn>;
// Attention of one query row against a quantized KV cache (lowbit --kv q8_0 | q4_0; ggml's
// block formats, 32 values per block along head_dim, so a head's row is hd / 32 whole blocks):
//   qq: the query as hd / 32 Q8_0 blocks (ggml's from_float for Q8_0: llama.cpp's flash
//       attention quantizes q to K's vec_dot_type, Q8_0 for both K formats);
//   K rows j < len at K + j * ks bytes, type k_type (T_Q8_0 or T_Q4_0);
//   V rows j < len at V + j * vs bytes, type v_type (T_F16, T_Q8_0 or T_Q4_0);
//   sc: scratch of len floats; out[hd].
// The arithmetic, the same on every level bit for bit (no FMA, fixed orders; the spec is
// ref::attend_q in csrc/ref/attn.cpp):
//   score_j: per block b in order, s += (float)isum_b * (dk_b * dq_b) (K Q8_0, ggml's
//            vec_dot_q8_0_q8_0) or s += ((float)isum_b * dk_b) * dq_b (K Q4_0, vec_dot_q4_0_q8_0),
//            isum_b the exact int32 dot of the codes (Q4_0: nibble - 8); score_j = s * scale,
//            then capped if softcap > 0 (attn_f16_fn's softcap);
//   m = max(max_j score_j, sink); e_j = attn_exp(score_j - m) (ref::attn_exp: Cody-Waite and a
//   degree-6 polynomial in plain mul / add, <= 2 ulp);
//   sum: 8 partial sums, partial l over the keys j = l mod 8 below len & ~7 in order, joined
//   ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)), then the tail keys in order, then the
//   sink's attn_exp(sink - m) (a sink of -inf: none);
//   acc[d] = sum over j in order of (v_j[d] * e_j), v_j[d] the exact dequantized value
//   (code * d, or the half); out[d] = acc[d] * (1 / sum).
// Unlike the half cache (llama.cpp's default non-flash path: q and p rounded to half), this
// is llama.cpp's flash attention (which a quantized V cache needs): q in Q8_0, integer block
// dots, float probabilities, V accumulated in float and divided by the sum at the end.
using attn_q_fn = void (*)(const uint8_t *qq, int k_type, const uint8_t *K, size_t ks, int v_type, const uint8_t *V,
                           size_t vs, int len, int hd, float scale, float sink, float softcap, float *sc, float *out);
using AttnQKernel = KernelSlot<attn_q_fn>;  // e.g. "attn_q_avx2" (LOWBIT_NO_ATTN_Q_AVX2=1 turns it off)

// Attention of nq query rows that share one head's quantized K and V rows (a GQA group's heads,
// and the tokens of one slot's prompt block: Engine::attention), as mla_f16_fn is for the half cache:
//   qq: nq rows of hd / 32 Q8_0 blocks each, row r at qq + r * (hd / 32) * sizeof(block_q8_0);
//   row r sees keys j < lens[r] (1 <= lens[r]); K, ks, V, vs, k_type, v_type, hd, scale as attn_q_fn;
//   sinks: null, or sinks[r] the attention sink of row r (attn_q_fn's sink; null: -inf for all);
//   softcap: attn_q_fn's, for every row;
//   sc: scratch of nq * max(lens) floats; out[nq][hd].
// Row r's out is bitwise what attn_q_fn computes on (qq row r, lens[r], sinks[r]) alone, whichever
// rows share the call and in whatever order (I2, I3): a token's logits do not depend on its chunk,
// its block or the threads. The point of the call: each K block and V row is decoded once for all
// the rows that see it, not once per row. Cache values must be finite (a row's keys past its own
// length may be weighted by 0).
using attn_q_rows_fn = void (*)(const uint8_t *qq, int nq, const int32_t *lens, int k_type, const uint8_t *K,
                                size_t ks, int v_type, const uint8_t *V, size_t vs, int hd, float scale,
                                const float *sinks, float softcap, float *sc, float *out);
using AttnQRowsKernel = KernelSlot<attn_q_rows_fn>;  // e.g. "attn_q_rows_avx2" (LOWBIT_NO_ATTN_Q_ROWS_AVX2=1 turns it off)
// The rows one by one through a level's attn_q_fn F: the scalar level's attn_q_rows_fn (over
// ref::attend_q) and the levels without a shared kernel of their own (aarch64). Bitwise the
// contract by construction; no cache row is shared.
template <attn_q_fn F>
void attn_q_rows_by_row(const uint8_t *qq, int nq, const int32_t *lens, int k_type, const uint8_t *K, size_t ks,
                        int v_type, const uint8_t *V, size_t vs, int hd, float scale, const float *sinks,
                        float softcap, float *sc, float *out) {
    const size_t qrow = (size_t)(hd / QK) * sizeof(block_q8_0);
    for (int r = 0; r < nq; ++r)
        F(qq + (size_t)r * qrow, k_type, K, ks, v_type, V, vs, lens[r], hd, scale, sinks ? sinks[r] : -INFINITY,
          softcap, sc, out + (size_t)r * hd);
}

// The gated-linear-unit epilogue of an FFN's gate/up pair (csrc/ref/glu.cpp is the spec):
//   out[i] = act(g[i]) * u[i] for i < n, with act by kind:
//     GLU_SILU:  silu(g) = g / (1 + exp(-g)), exp as ggml's vectorised ggml_v_expf (range
//                reduction + degree-5 polynomial, ~1.5 ulp; 2^n applied as avx512's scalef);
//     GLU_RELU2: relu(g)^2 = (g > 0 ? g : 0)^2, in ggml's order sqr(relu(g)), then * up.
// Elementwise and lane-independent: every level computes the same function bit for bit
// (tests/test_glu.py), so a token's result never depends on its window or the row split.
// out may alias g or u exactly (same pointer), not partially.
//     GLU_SWIGLU_OAI (gpt-oss, llama.cpp's swiglu_oai, alpha = 1.702, limit = 7 as llama.cpp fixes
//                them): x = min(g, limit), y = clamp(u, -limit, limit),
//                out = x / (1 + expf(alpha * -x)) * (y + 1), expf libm's as ggml's scalar loop.
//                The scalar reference only (ref::glu; the SIMD levels do not take this kind).
//     GLU_GEGLU (gemma3; ggml's ggml_vec_geglu_f32 as llama.cpp builds it, GGML_GELU_FP16):
//                g <= -10: +0; g >= 10: g * u; else (NaN included) T[fp16(g)] * u, where
//                fp16() rounds to nearest even (F16C) and T[h] = fp16(gelu(float(h))) is ggml's
//                ggml_table_gelu_f16, gelu(x) = 0.5x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))
//                in float with libm's tanhf (ref::gelu_table: the 65536 values as floats).
//                Every level (a gather from that table at avx2 / avx512).
enum GluKind : int { GLU_SILU = 0, GLU_RELU2 = 1, GLU_SWIGLU_OAI = 2, GLU_GEGLU = 3 };
constexpr float kSwigluOaiAlpha = 1.702f, kSwigluOaiLimit = 7.0f;
using glu_fn = void (*)(const float *g, const float *u, float *out, int64_t n, int kind);
using GluKernel = KernelSlot<glu_fn>;  // e.g. "glu_avx512"
// Counters of epilogue calls per (kind, level of the table used): values = elements.
void count_glu(int kind, int isa, int64_t rows, int64_t values);

// One token's gated delta-rule step on one value head's state (the hybrid Qwen models'
// linear attention; csrc/deltanet.cpp, spec csrc/ref/deltanet.cpp). M[j * S + i]: row j =
// value index, i = key index (ggml's layout), S x S floats, updated in place; k, q: the token's
// l2-normed key and query [S]; v [S]; per row j in order:
//   M[j] *= decay;  d = (v[j] - M[j] . k) * beta;  M[j] += k * d;  o[j] = (M[j] . q) * scale.
// Rows are independent; a row's arithmetic depends only on its inputs (never on the window,
// the token's slot or the thread), so chunked prefill and decode give the same bits (I8).
using delta_fn = void (*)(float *M, const float *k, const float *q, const float *v, float decay, float beta,
                          float scale, float *o, int S);
using DeltaKernel = KernelSlot<delta_fn>;

// One token's Mamba-2 state update on one SSM head (granitehybrid's SSM layers; csrc/mamba2.cpp,
// spec csrc/ref/ssm_scan.cpp, ggml's GGML_OP_SSM_SCAN with a scalar decay per head). s[i * N + j]:
// row i = the head's channel (P rows), j = state index (N), ggml's layout, updated in place; B, C:
// the token's [N] input and output projections of the head's group; x [P]; dt the head's
// softplus'd step, dA = exp(dt * A). Per row i in order:
//   s[i] = s[i] * dA + B * (x[i] * dt)   (two products, one sum: ggml's rounding);  y[i] = s[i] . C.
// The dot runs in 8 lanes (lane l sums j = l mod 8 in order, the lanes then added in the fixed
// tree of csrc/ref/ssm_scan.cpp), so every level gives the same bits as the reference: a token's
// state depends only on its inputs, never on the window, slot, thread or level (I8).
using scan_fn = void (*)(float *s, const float *B, const float *C, const float *x, float dt, float dA, float *y,
                         int P, int N);
using ScanKernel = KernelSlot<scan_fn>;

struct KernelTable {
    KernelEntry e[64];
    KernelEntry i8s;  // T_I8_S (id above 64)
    // A format's rows repacked 8 at a time (csrc/repack.h), where a level has kernels for that
    // layout (rows[] and gemm; empty elsewhere): r8[id - kR8FirstId]. The engine repacks a
    // matrix at load when the selected level's entry for its format has rows (Engine::repack;
    // LOWBIT_NO_REPACK=1 keeps them as read). The row-kernel contract of csrc/kernels.h on the
    // repacked bytes, bitwise the format's own entry per token and row (I2, I3, I8). Counted
    // under the layout's id (kQ4kR8Id, ...).
    KernelEntry r8[kR8Layouts];
    AttnKernel attn;  // the engine's attention over a half KV cache
    MlaKernel mla;    // DeepSeek's latent attention over a half cache
    AttnQKernel attnq;  // and over a quantized one
    AttnQRowsKernel attnq_rows;  // its rows sharing one head's cache rows (a GQA group, a prompt block)
    GluKernel glu;    // the FFN's gate/up epilogue
    DeltaKernel delta;  // the delta-net state update (hybrid Qwen models)
    ScanKernel scan;    // the Mamba-2 state update (granitehybrid)
    KernelEntry &at(int id) { return id == T_I8_S ? i8s : is_r8_id(id) ? r8[id - kR8FirstId] : e[id]; }
    const KernelEntry &at(int id) const { return id == T_I8_S ? i8s : is_r8_id(id) ? r8[id - kR8FirstId] : e[id]; }
    void set_rows_all(int id, rows_fn f, const char *name, int isa) {
        for (int nt = 1; nt <= MAX_NT; ++nt) at(id).rows[nt] = RowKernel{f, name, isa};
    }
    void set_quant_act(int id, quant_act_fn f, const char *name, int isa) { at(id).quant_act = {f, name, isa}; }
};

// The kernel table dispatch selected (isa < 0: the highest level this CPU runs, below any
// LOWBIT_MAX_ISA cap), or what runs at level isa (tests compare levels; an empty table, every fn
// null, if isa is not available here). Filled once (dispatch.cpp); read-only afterwards.
const KernelTable &kernel_table(int isa = -1);

// Call counters per (type id, nt, level of the table used): which path really ran
// (lowbit.kernels.stats()). nt = 0 counts the entry's GEMM (one call per matmul).
void count_call(int type_id, int nt, int isa, int64_t rows);
// Activation quantizer calls per (activation type id, level of its quantizer): one call
// quantizes `rows` tokens of n values (values = rows * n).
void count_quant(int type_id, int isa, int64_t rows, int64_t values);

}  // namespace lowbit
