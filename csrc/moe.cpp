// The Mixture-of-Experts feed-forward: the CPU expert pool.
//
// Per layer, for a window of T tokens (a decode step, a prompt chunk, a speculative verify
// window):
//   1. router: logits[T][E] = ffn_gate_inp . x through the float-row kernels. For F16/BF16
//      routers x is first rounded to that type, as ggml does (its vec_dot_type for F16/BF16
//      weights is F16/BF16): near-tied experts then rank as in llama.cpp.
//   2. the router bias added if any (gpt-oss); EXPERT_SOFTMAX: softmax over all E logits (exp
//      in float, sum in double, as ggml_soft_max), top-K per token (higher probability first;
//      equal probabilities: lower expert index first); EXPERT_SOFTMAX_TOPK (gpt-oss): top-K of
//      the logits (same order), then the softmax over those K; EXPERT_SIGMOID (glm4moe):
//      p = 1 / (1 + expf(-logit)) per expert (libm's expf, as ggml_vec_sigmoid_f32), top-K of
//      p + exp_probs_b (the selection bias; same order), the weights the chosen experts' p
//      (ranked_topk below). The K weights renormalised to
//      sum 1 (expert_norm: qwen3moe, mixtral; the sum clamped at 2^-14 as llama.cpp) and
//      scaled (expert_weights_scale).
//   3. tokens grouped by expert: slot s = (expert, its tokens in increasing order).
//   4. x quantized once per token to the experts' activation format and gathered by slot,
//      shared read-only by every expert and thread.
//   5. a work list of (expert, row range) items, taken by the threads from an atomic
//      counter: gate and up rows for all of that expert's tokens (row kernels with
//      nt = the expert's token count, chunked by 8: the rows are decoded once per 8
//      tokens), the experts' gate / up biases if any, the GLU epilogue (SwiGLU, ReLU^2 or
//      gpt-oss's clamped SwiGLU by c_.ffn_act) fused on those rows (glu_rows,
//      csrc/matmul.cpp); then those rows quantized per slot, and the down items (plus the down
//      bias, if any). Gate/up and down are ONE work list in one pool dispatch: an expert's
//      down items start once its gate/up items are done (per-expert counters, below).
//   6. out[t] = sum over k = 0..K-1 (rank order) of w[t][k] * down_slot(t,k); plus the
//      shared expert: qwen2moe's times sigmoid(ffn_gate_inp_shexp . x), glm4moe's as it is.
// Router lookahead (optional, Engine::lookahead below) only reads pages ahead.
// Each token's arithmetic is the same whatever the other tokens of its window and however
// the items fall on threads (row kernels keep I2/I3, activations are quantized per token,
// the sum order is the token's own rank order), so its output is bitwise identical alone,
// in a window, and under any thread count.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <sys/mman.h>
#include <unistd.h>

#include "dispatch.h"
#include "engine.h"
#include "fp16.h"
#include "matmul.h"
#include "ref/ref.h"
#include "threadpool.h"

namespace lowbit {

// ggml's GGML_FP32_TO_BF16: round to nearest even (NaN kept a NaN).
static inline float round_bf16(float f) {
    uint32_t u = f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return f;
    u = (u + (0x7fffu + ((u >> 16) & 1u))) & 0xffff0000u;
    return bits_to_f32(u);
}

// Bytes one token takes in activation format af for rows of n values (F32: the floats).
static size_t act_bytes(const Format &af, int64_t n) {
    return af.id == T_F32 ? (size_t)n * sizeof(float) : row_bytes(&af, n);
}

// Activation format af's quantizer (nullptr for F32: the floats are copied), counted for
// `rows` rows of n values (the caller counts once per phase, on its own thread).
static quant_act_fn act_quantizer(const Format &af, int64_t rows, int64_t n) {
    const quant_act_fn q = af.id == T_F32 ? nullptr : kernel_entry(af.id).quant_act.fn;
    if (q && rows > 0) count_quant(af.id, kernel_entry(af.id).quant_act.isa, rows, rows * n);
    return q;
}

// rows [r0, r1) of x[r * xs .. + n) -> dst + r * arb through q (act_quantizer's; nullptr: copy)
static void quant_span(quant_act_fn q, const float *x, int64_t r0, int64_t r1, int64_t n, size_t xs, uint8_t *dst,
                       size_t arb) {
    for (int64_t r = r0; r < r1; ++r) {
        if (q) q(x + (size_t)r * xs, dst + (size_t)r * arb, n);
        else std::memcpy(dst + (size_t)r * arb, x + (size_t)r * xs, (size_t)n * sizeof(float));
    }
}

// rows x[r * xs .. + n) -> dst + r * arb in activation format af, split over threads.
static void quant_rows(const Format &af, const float *x, int64_t rows, int64_t n, size_t xs, uint8_t *dst,
                       size_t arb, int threads) {
    if (rows <= 0) return;
    const quant_act_fn q = act_quantizer(af, rows, n);
    // a decode step's few rows: on the calling thread (a pool round trip costs more)
    const int nth = rows * n <= (1 << 16) ? 1 : (int)std::min<int64_t>(threads, rows);
    ThreadPool::instance().run(nth, [&](int i, int nt) {
        int64_t b, e;
        split_range(rows, i, nt, &b, &e);
        quant_span(q, x, b, e, n, xs, dst, arb);
    });
}

// ggml_soft_max of v[0..n): exp in float, the sum in double, times 1/sum in float
static void softmax(float *v, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; ++i) mx = v[i] > mx ? v[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) { v[i] = std::exp(v[i] - mx); sum += v[i]; }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; ++i) v[i] *= inv;
}

namespace {
// One weight matrix of the pool: expert e's rows start at w + e * rows_per_expert * stride.
struct ExpertMat {
    const Mat *m;
    int64_t rows;                 // rows per expert
    const KernelEntry *k;
    const uint8_t *w(int e) const { return m->w + (size_t)e * rows * m->stride; }
};

// Appends to items the row ranges of every used expert, about 8 items per thread (at least 16 rows each, a
// multiple of 16), so the atomic work list balances uneven token counts across threads.
void make_items(std::vector<MoeItem> &items, const std::vector<int32_t> &count, int64_t rows, int threads) {
    int64_t active = 0;
    for (int32_t c : count) active += c > 0;
    int64_t ch = rows * active / ((int64_t)threads * 8);
    ch = std::max<int64_t>(16, (ch + 15) / 16 * 16);
    ch = std::min<int64_t>(ch, rows);
    for (size_t e = 0; e < count.size(); ++e)
        if (count[e] > 0)
            for (int64_t r0 = 0; r0 < rows; r0 += ch) items.push_back({(int)e, (int)r0, (int)std::min(rows, r0 + ch)});
}

// The work list's items in claim order, by as many threads as there are items (at most
// `threads`): fn(item index).
template <class F>
void run_items(size_t n_items, int threads, F &&fn) {
    std::atomic<size_t> next{0};
    const int nth = (int)std::min<size_t>((size_t)threads, n_items);
    ThreadPool::instance().run(nth, [&](int, int) {
        for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n_items;) fn(i);
    });
}

// The K largest of score[0, E) into s[0, K), largest first (ties: the lower index first; a NaN is
// taken only where nothing before it was), marked in taken[0, E) (all 0 on entry); returns the
// largest score not taken, or `none` if every one is below it. O(E * K): the taken map, not a
// scan of the picks so far (that was O(E * K^2): 2.5% of a 30B-A3B-shaped prefill, serial).
inline float top_k(const float *score, int E, int K, int32_t *s, uint8_t *taken, float none) {
    for (int k = 0; k < K; ++k) {
        int best = -1;
        for (int e = 0; e < E; ++e)
            if (!taken[e] && (best < 0 || score[e] > score[best])) best = e;
        taken[best] = 1;
        s[k] = best;
    }
    float next = none;
    for (int e = 0; e < E; ++e)
        if (!taken[e]) next = std::max(next, score[e]);
    return next;
}

// Wait (spin, then yield the core: wait_step) until *flag is set by another thread of the dispatch.
inline void wait_flag(const int32_t *flag) {
    for (int s = 0; !__atomic_load_n(flag, __ATOMIC_ACQUIRE); ++s) wait_step(s);
}
}  // namespace

void Engine::moe_ffn(int layer, const float *x, int T, float *out, const float *router_x) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int E = c_.n_expert, K = c_.n_expert_used, ef = c_.expert_ffn, dim = c_.dim;
    const int S = T * K;  // slots: (token, expert) pairs
    const int threads = threads_ > 0 ? threads_ : ThreadPool::instance().size();
    const int isa = cpu_info().selected;
    const auto t0 = now();

    // 1-2. router, softmax, top-K, weights
    rlog_.resize((size_t)T * E);
    const float *rin = router_x ? router_x : x;
    if (L.router.type == T_BF16 || L.router.type == T_F16) {
        rx_.resize((size_t)T * dim);
        const float *src = rin;
        for (size_t i = 0; i < (size_t)T * dim; ++i)
            rx_[i] = L.router.type == T_BF16 ? round_bf16(src[i]) : fp16_to_f32(f32_to_fp16(src[i]));
        rin = rx_.data();
    }
    {   // the router of a decode step is tiny (E x dim): on the calling thread
        const int saved = threads_;
        if ((int64_t)T * E * dim <= (1 << 17)) threads_ = 1;
        matmul(L.router, rin, T, rlog_.data());
        threads_ = saved;
    }
    sel_.resize((size_t)S);
    wsel_.resize((size_t)S);
    rgap_[(size_t)layer].resize((size_t)T);
    if (L.router_b)
        for (int t = 0; t < T; ++t)
            for (int e = 0; e < E; ++e) rlog_[(size_t)t * E + e] += L.router_b[e];
    const bool topk_first = c_.expert_gating == EXPERT_SOFTMAX_TOPK;
    if (c_.expert_gating == EXPERT_SIGMOID || (c_.expert_gating == EXPERT_SOFTMAX && (L.exp_probs_b || c_.expert_groups > 1))) {
        biased_topk(layer, T, c_.expert_gating == EXPERT_SIGMOID);
    } else {
        std::vector<uint8_t> taken((size_t)E);
        for (int t = 0; t < T; ++t) {
            float *p = rlog_.data() + (size_t)t * E;
            if (!topk_first) softmax(p, E);  // else p stays the logits: ranked as they are
            int32_t *s = sel_.data() + (size_t)t * K;
            float *w = wsel_.data() + (size_t)t * K;
            std::fill(taken.begin(), taken.end(), 0);
            // the routing margin: how far the K-th expert's probability is above the next one's
            const float next = top_k(p, E, K, s, taken.data(), topk_first ? -INFINITY : 0.0f);
            for (int k = 0; k < K; ++k) w[k] = p[s[k]];
            rgap_[(size_t)layer][(size_t)t] = w[K - 1] - next;  // (EXPERT_SOFTMAX_TOPK: in logits)
            if (topk_first) softmax(w, K);
        }
    }
    for (int t = 0; t < T; ++t) {
        float *w = wsel_.data() + (size_t)t * K;
        if (c_.expert_norm) {
            double ws = 0.0;
            for (int k = 0; k < K; ++k) ws += w[k];
            const float d = std::max((float)ws, 6.103515625e-5f);
            for (int k = 0; k < K; ++k) w[k] /= d;
        }
        if (c_.expert_scale != 0.0f && c_.expert_scale != 1.0f)
            for (int k = 0; k < K; ++k) w[k] *= c_.expert_scale;
    }
    routes_[(size_t)layer].assign(sel_.begin(), sel_.end());

    // 3. group by expert
    ecount_.assign((size_t)E, 0);
    for (int i = 0; i < S; ++i) ++ecount_[(size_t)sel_[(size_t)i]];
    eoff_.assign((size_t)E + 1, 0);
    for (int e = 0; e < E; ++e) eoff_[(size_t)e + 1] = eoff_[(size_t)e] + ecount_[(size_t)e];
    std::vector<int32_t> fill(eoff_.begin(), eoff_.end() - 1);
    slot_tok_.resize((size_t)S);
    slot_of_.resize((size_t)S);
    for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
            const int s = fill[(size_t)sel_[(size_t)t * K + k]]++;
            slot_tok_[(size_t)s] = t;
            slot_of_[(size_t)t * K + k] = s;
        }
    if (lookahead_ && layer > 0) {
        int64_t routed = 0, hits = 0;
        for (int e = 0; e < E; ++e)
            if (ecount_[(size_t)e] > 0) { ++routed; hits += predicted_[(size_t)layer][(size_t)e] != 0; }
        la_.routed += routed;
        la_.hits += hits;
    }
    if (lookahead_ && layer + 1 < c_.layer_end) lookahead(layer + 1, x, T);  // (a stage reads ahead only its own layers)
    const auto t1 = now();

    if (collect_)  // importance matrices: each expert's routed tokens (Engine::record_act)
        for (int e = 0; e < E; ++e) {
            const int32_t *toks = slot_tok_.data() + eoff_[(size_t)e];
            if (!c_.ffn_ungated) record_act(L.gate_exps, x, ecount_[(size_t)e], e, E, toks);
            record_act(L.up_exps, x, ecount_[(size_t)e], e, E, toks);
        }

    // 4. activations: quantized once per token, gathered by slot (gate and up may differ)
    // (ungated experts, nemotron_h: G stands for up, its rows never read: glu_rows gets no gate)
    const bool ungated = c_.ffn_ungated;
    const Mat &gm = ungated ? L.up_exps : L.gate_exps;
    const ExpertMat G{&gm, ef, &entry_of(gm)};
    const ExpertMat U{&L.up_exps, ef, &entry_of(L.up_exps)};
    const ExpertMat D{&L.down_exps, dim, &entry_of(L.down_exps)};
    for (const ExpertMat *m : {&G, &U, &D})
        for (int nt = 1; nt <= MAX_NT; ++nt)
            if (!m->k->rows[nt].fn) throw std::invalid_argument("moe: no row kernel for an expert matrix's format");
    const Format &ag = *format_by_id(format_by_id(G.m->type)->act);
    const Format &au = *format_by_id(format_by_id(U.m->type)->act);
    const Format &ad = *format_by_id(format_by_id(D.m->type)->act);
    const size_t gb = act_bytes(ag, dim), ub = act_bytes(au, dim), db = act_bytes(ad, ef);
    auto gather = [&](const Format &af, size_t arb, std::vector<uint8_t> &dst) {
        xq_.resize((size_t)T * arb);
        quant_rows(af, x, T, dim, (size_t)dim, xq_.data(), arb, threads);
        dst.resize((size_t)S * arb);
        for (int s = 0; s < S; ++s)
            std::memcpy(dst.data() + (size_t)s * arb, xq_.data() + (size_t)slot_tok_[(size_t)s] * arb, arb);
    };
    gather(ag, gb, xs_);
    const bool same_act = au.id == ag.id;
    if (!same_act) gather(au, ub, us_);
    const uint8_t *xg = xs_.data(), *xu = same_act ? xs_.data() : us_.data();

    // The GLU epilogue, and the call counters of the kernels step 5 runs (per expert: gate and
    // up with the GLU fused, as the dense FFN, into eg_[s][ef]; down into ed_[s][dim])
    const GluKernel &glu = kernel_table().glu;
    const int kind = glu_kind(c_.ffn_act);
    const glu_fn epilogue = kind == GLU_SWIGLU_OAI ? ref::glu : glu.fn;  // (OAI: the reference only)
    eg_.resize((size_t)S * ef);
    for (int e = 0; e < E; ++e) {
        const int cnt = ecount_[(size_t)e];
        const int glu_gemm = (int)glu_gemm_tokens(*G.k, *U.k, cnt), down_gemm = (int)gemm_tokens(*D.k, cnt);  // (as glu_rows)
        const int cg = count_id(G.m->type, *G.k), cu = count_id(U.m->type, *U.k), cdn = count_id(D.m->type, *D.k);
        if (glu_gemm) {
            if (!ungated) count_call(cg, 0, gemm_level(*G.k, glu_gemm, isa), ef);
            count_call(cu, 0, gemm_level(*U.k, glu_gemm, isa), ef);
        }
        if (down_gemm) count_call(cdn, 0, gemm_level(*D.k, down_gemm, isa), dim);
        for (int t0c = glu_gemm, ntc; t0c < cnt; t0c += ntc) {  // (as glu_rows)
            ntc = glu_window(*G.k, *U.k, cnt - t0c);
            if (!ungated) count_call(cg, ntc, isa, ef);
            count_call(cu, ntc, isa, ef);
        }
        for (int t0c = down_gemm, ntc; t0c < cnt; t0c += ntc) {  // (as the down items)
            ntc = next_window(*D.k, cnt - t0c);
            count_call(cdn, ntc, isa, dim);
        }
        if (ecount_[(size_t)e] > 0 && !ungated) count_glu(kind, glu.isa, ef, (int64_t)ecount_[(size_t)e] * ef);
    }
    // 5. gate/up, then down, in ONE pool dispatch: the work list is every used expert's gate/up
    // items followed by every used expert's down items, in the same expert order, claimed from
    // one counter, so both threads stream expert rows back to back from the first gate row to
    // the last down row (no barrier, no serial quantization between the two phases). The thread
    // that finishes an expert's last gate/up item quantizes that expert's SwiGLU rows (its
    // slots) for down and marks it ready; a down item waits for its expert's mark (all gate/up
    // items are claimed before any down item, by threads that are running them, so the wait
    // ends; in practice the first down items' experts finished long before). Each value is
    // computed by the same kernel on the same bytes as with two dispatches (bitwise the same).
    ys_.resize((size_t)S * db);
    ed_.resize((size_t)S * dim);
    std::vector<MoeItem> &items = items_;
    items.clear();
    make_items(items, ecount_, ef, threads);
    const size_t n_gu = items.size();
    make_items(items, ecount_, dim, threads);
    eleft_.assign((size_t)E, 0);  // gate/up items left per expert
    eready_.assign((size_t)E, 0); // 1: the expert's rows are quantized for down
    for (size_t i = 0; i < n_gu; ++i) ++eleft_[(size_t)items[i].e];
    const quant_act_fn qd = act_quantizer(ad, S, ef);  // (counted here, once, as quant_rows would)
    const uint64_t gid = new_act_id();  // (xs_ / us_ stay unchanged for the phase)
    const uint64_t did = new_act_id();
    run_items(items.size(), threads, [&](size_t i) {
        const MoeItem &it = items[i];
        const int64_t off = eoff_[(size_t)it.e], cnt = ecount_[(size_t)it.e];
        if (i < n_gu) {
            // expert it.e's gate and up rows; the experts' tensors carry no output scale
            const RowMat g{format_by_id(G.m->type), G.k, ungated ? nullptr : G.w(it.e), G.m->stride, G.m->scale, 1.0f};
            const RowMat u{format_by_id(U.m->type), U.k, U.w(it.e), U.m->stride, U.m->scale, 1.0f};
            const float *bg = L.gate_exps_b ? L.gate_exps_b + (size_t)it.e * ef : nullptr;
            const float *bu = L.up_exps_b ? L.up_exps_b + (size_t)it.e * ef : nullptr;
            glu_rows(g, xg + (size_t)off * gb, gb, u, xu + (size_t)off * ub, ub, cnt, dim, epilogue, kind, it.r0,
                     it.r1, glu_tile_rows(g, u, cnt), eg_.data() + (size_t)off * ef, (size_t)ef, bg, bu, gid);
            if (__atomic_sub_fetch(&eleft_[(size_t)it.e], 1, __ATOMIC_ACQ_REL) == 0) {
                quant_span(qd, eg_.data(), off, off + cnt, ef, (size_t)ef, ys_.data(), db);
                __atomic_store_n(&eready_[(size_t)it.e], 1, __ATOMIC_RELEASE);
            }
            return;
        }
        wait_flag(&eready_[(size_t)it.e]);
        // the expert's tokens in windows (next_window), or in one GEMM call and a tail of
        // windows (gemm_tokens; I8)
        const int64_t gemm = gemm_tokens(*D.k, cnt);
        for (int64_t t0c = 0, ntc; t0c < cnt; t0c += ntc) {
            const bool g = t0c < gemm;
            ntc = g ? gemm : next_window(*D.k, cnt - t0c);
            const size_t s0 = (size_t)(off + t0c);
            RowArgs a{D.w(it.e), D.m->stride, ys_.data() + s0 * db, db, ed_.data() + s0 * dim, (size_t)dim, ef,
                      D.m->scale, g ? did : 0};
            (g ? gemm_kernel(*D.k, ntc).fn : window_kernel(*D.k, (int)ntc).fn)(a, it.r0, it.r1, (int)ntc);
            if (L.down_exps_s) {  // gemma4: the expert's output scale (ggml_mul after mul_mat_id)
                const float sc = L.down_exps_s[it.e];
                for (int t = 0; t < ntc; ++t)
                    for (int r = it.r0; r < it.r1; ++r) ed_[(s0 + t) * dim + r] *= sc;
            }
            if (L.down_exps_b) {
                const float *b = L.down_exps_b + (size_t)it.e * dim;
                for (int t = 0; t < ntc; ++t)
                    for (int r = it.r0; r < it.r1; ++r) ed_[(s0 + t) * dim + r] += b[r];
            }
        }
    });

    if (collect_)  // (after the dispatch: eg_ holds every expert's SwiGLU rows until the next layer)
        for (int e = 0; e < E; ++e)
            record_act(L.down_exps, eg_.data() + (size_t)eoff_[(size_t)e] * ef, ecount_[(size_t)e], e, E);

    // 6. each token's experts summed in its rank order
    for (int t = 0; t < T; ++t) {
        float *o = out + (size_t)t * dim;
        const float *w = wsel_.data() + (size_t)t * K;
        const float *d0 = ed_.data() + (size_t)slot_of_[(size_t)t * K] * dim;
        for (int i = 0; i < dim; ++i) o[i] = w[0] * d0[i];
        for (int k = 1; k < K; ++k) {
            const float *d = ed_.data() + (size_t)slot_of_[(size_t)t * K + k] * dim;
            const float wk = w[k];
            for (int i = 0; i < dim; ++i) o[i] += wk * d[i];
        }
    }
    const auto t2 = now();

    // the shared expert: qwen2moe's out += sigmoid(gate_inp_shexp . x) * ffn_shexp(x); glm4moe's
    // (not gated) out += ffn_shexp(x), llama.cpp's add of the routed and the shared outputs
    if (c_.shexp_ffn > 0 && !c_.shexp_gated) {
        sh_.resize((size_t)T * dim);
        dense_ffn(L.sh_gate, L.sh_up, L.sh_down, x, T, sh_.data());
        for (size_t i = 0; i < (size_t)T * dim; ++i) out[i] += sh_[i];
    } else if (c_.shexp_ffn > 0) {
        sh_.resize((size_t)T * (dim + 1));
        float *shg = sh_.data() + (size_t)T * dim;
        matmul(L.sh_gate_inp, x, T, shg);
        dense_ffn(L.sh_gate, L.sh_up, L.sh_down, x, T, sh_.data());
        for (int t = 0; t < T; ++t) {
            const float gt = 1.0f / (1.0f + std::exp(-shg[t]));
            for (int i = 0; i < dim; ++i) out[(size_t)t * dim + i] += gt * sh_[(size_t)t * dim + i];
        }
    }
    if (stats_on_) {
        LayerStats &st = stats_[(size_t)layer];
        int64_t distinct = 0;
        for (int32_t c : ecount_) distinct += c > 0;
        st.distinct_experts += distinct;
        st.t_router += seconds(t0, t1);
        st.t_experts += seconds(t1, t2);
        st.t_ffn += seconds(t2, now());
        st.weight_bytes += mat_bytes(L.router) + mat_bytes(L.sh_gate_inp) + mat_bytes(L.sh_gate) +
                           mat_bytes(L.sh_up) + mat_bytes(L.sh_down) +
                           (double)distinct * (double)(ef * ((ungated ? 0 : G.m->stride) + U.m->stride) + dim * D.m->stride);
    }
}

// Routing with the expert selection bias (llama.cpp's build_moe_ffn with exp_probs_b; glm4moe) of
// this window's router logits rlog_[T][E]: p = 1 / (1 + expf(-logit)) in float (sigmoid: glm4moe's
// expert_gating_func 2) or the softmax over all E (gating func 1); the K experts of the largest
// p + bias (the bias chooses, it does not weigh; equal scores: the lower index first), best
// first, into sel_; their unbiased p into wsel_; the margin (the K-th chosen score minus the best
// unchosen one) into rgap_. Normalisation and scale follow in moe_ffn.
// Group-limited routing (llama.cpp's build_moe_ffn with n_expert_groups > 1): a group of
// E / expert_groups consecutive experts scores the sum of its two best selection scores; the
// expert_groups_used best groups (equal sums: the lower group first) stay, every other expert's
// score becomes -inf (never chosen).
void Engine::group_mask(float *score) const {
    const int E = c_.n_expert, G = c_.expert_groups, per = E / G;
    std::vector<float> gs((size_t)G);
    for (int g = 0; g < G; ++g) {
        float b0 = -INFINITY, b1 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; ++e) {
            const float v = score[e];
            if (v > b0) { b1 = b0; b0 = v; } else if (v > b1) b1 = v;
        }
        gs[(size_t)g] = per > 1 ? b0 + b1 : b0;
    }
    std::vector<uint8_t> keep((size_t)G, 0);
    for (int k = 0; k < c_.expert_groups_used; ++k) {
        int best = -1;
        for (int g = 0; g < G; ++g)
            if (!keep[(size_t)g] && (best < 0 || gs[(size_t)g] > gs[(size_t)best])) best = g;
        keep[(size_t)best] = 1;
    }
    for (int g = 0; g < G; ++g)
        if (!keep[(size_t)g])
            for (int e = g * per; e < (g + 1) * per; ++e) score[e] = -INFINITY;
}

void Engine::biased_topk(int layer, int T, bool sigmoid) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int E = c_.n_expert, K = c_.n_expert_used;
    std::vector<float> score((size_t)E);
    std::vector<uint8_t> taken((size_t)E);
    for (int t = 0; t < T; ++t) {
        float *p = rlog_.data() + (size_t)t * E;
        if (!sigmoid) softmax(p, E);
        for (int e = 0; e < E; ++e) {
            if (sigmoid) p[e] = 1.0f / (1.0f + std::exp(-p[e]));
            score[(size_t)e] = L.exp_probs_b ? p[e] + L.exp_probs_b[e] : p[e];
        }
        if (c_.expert_groups > 1) group_mask(score.data());
        int32_t *s = sel_.data() + (size_t)t * K;
        float *w = wsel_.data() + (size_t)t * K;
        std::fill(taken.begin(), taken.end(), 0);
        const float next = top_k(score.data(), E, K, s, taken.data(), -INFINITY);
        for (int k = 0; k < K; ++k) w[k] = p[s[k]];
        rgap_[(size_t)layer][(size_t)t] = score[(size_t)s[K - 1]] - next;
    }
}

// Predict layer `next`'s experts for the window from x (the current layer's FFN input: the
// residual stream changes little from one layer to the next) with layer next's own router
// (top-K of its logits per token), and ask the kernel to read their pages ahead. madvise
// WILLNEED on a file mapping starts the reads and returns; the experts of the current layer
// compute meanwhile. Only read ahead: the arithmetic never depends on it.
void Engine::lookahead(int next, const float *x, int T) {
    const LayerWeights &N = layers_[(size_t)next];
    if (!N.router.present()) return;  // (the next layer has no experts: nemotron_h_moe's mixers)
    const int E = c_.n_expert, K = c_.n_expert_used, dim = c_.dim;
    std::vector<float> lg((size_t)T * E), xr;
    const float *in = x;
    if (N.router.type == T_BF16 || N.router.type == T_F16) {
        xr.resize((size_t)T * dim);
        for (size_t i = 0; i < xr.size(); ++i)
            xr[i] = N.router.type == T_BF16 ? round_bf16(x[i]) : fp16_to_f32(f32_to_fp16(x[i]));
        in = xr.data();
    }
    matmul(N.router, in, T, lg.data());
    std::vector<uint8_t> &pred = predicted_[(size_t)next];
    std::fill(pred.begin(), pred.end(), 0);
    std::vector<uint8_t> took((size_t)E);
    std::vector<int32_t> s((size_t)K);
    for (int t = 0; t < T; ++t) {
        std::fill(took.begin(), took.end(), 0);
        top_k(lg.data() + (size_t)t * E, E, K, s.data(), took.data(), -INFINITY);
        for (int k = 0; k < K; ++k) pred[(size_t)s[(size_t)k]] = 1;
    }
    static const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    auto ahead = [&](const Mat &m, int64_t rows, int e) {
        const uintptr_t a = (uintptr_t)(m.w + (size_t)e * rows * m.stride);
        const uintptr_t b = a + (size_t)rows * m.stride;
        const uintptr_t a0 = a & ~(uintptr_t)(page - 1);
        madvise((void *)a0, b - a0, MADV_WILLNEED);  // advice only: a failure changes nothing
    };
    for (int e = 0; e < E; ++e)
        if (pred[(size_t)e]) {
            ++la_.predicted;
            if (N.gate_exps.present()) ahead(N.gate_exps, c_.expert_ffn, e);
            ahead(N.up_exps, c_.expert_ffn, e);
            ahead(N.down_exps, dim, e);
        }
}

void Engine::moe_beside_mlp(int layer, int T, float *out) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int dim = c_.dim;
    const size_t n = (size_t)T * dim;
    mlp_.resize(n);
    dense_ffn(L.wgate, L.wup, L.wdown, h_.data(), T, mlp_.data());  // h_: ffn_norm(x_)
    rmsnorm(mlp_.data(), L.ffn_post_norm_1, mlp_.data(), T, dim);
    // the router's input: ggml_rms_norm, ggml_scale(1 / sqrtf(n_embd)), ggml_mul(ffn_gate_inp.scale)
    rin_.resize(n);
    rmsnorm(x_.data(), nullptr, rin_.data(), T, dim);
    const float inv = 1.0f / std::sqrt((float)dim);
    for (size_t i = 0; i < n; ++i) rin_[i] = rin_[i] * inv * L.router_in_scale[i % (size_t)dim];
    rmsnorm(x_.data(), L.ffn_pre_norm_2, h_.data(), T, dim);  // the experts' input
    moe_ffn(layer, h_.data(), T, out, rin_.data());
    rmsnorm(out, L.ffn_post_norm_2, out, T, dim);
    for (size_t i = 0; i < n; ++i) out[i] = mlp_[i] + out[i];  // ggml_add(cur_mlp, cur_moe)
}

}  // namespace lowbit
