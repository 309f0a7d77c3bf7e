#include "engine.h"
#include "repack.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <cstdio>
#include <new>
#include <stdexcept>

#include <sys/mman.h>

#include "dispatch.h"
#include "fp16.h"
#include "matmul.h"
#include "quant/common.h"
#include "ref/ref.h"
#include "threadpool.h"

namespace lowbit {

template <class T>
void ZeroArray<T>::reset(size_t n, bool huge) {
    release();
    if (n == 0) return;
    // (no MAP_NORESERVE: a cache larger than the machine's memory and swap fails here, at load,
    // as an allocation of it did, not at a slot's first use)
    const size_t bytes = n * sizeof(T), len = huge ? bytes + kHugePage : bytes;  // (room to align)
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    map_ = p, map_bytes_ = len;
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (huge) {
        a = (a + kHugePage - 1) & ~(uintptr_t)(kHugePage - 1);
        advise_huge_pages(reinterpret_cast<void *>(a), bytes);
    }
    p_ = reinterpret_cast<T *>(a);
    n_ = n;
}

// Commit bytes [b, b + n) of an anonymous map now (pages faulted in, still zero): what a slot
// will need anyway, taken once at its first use rather than spread over its first steps.
static void commit_pages(uint8_t *b, size_t n) {
    if (n == 0) return;
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // (Linux 5.14; older kernels refuse it: the loop below)
#endif
    const uintptr_t page = 4096, a = reinterpret_cast<uintptr_t>(b) & ~(page - 1);
    const uintptr_t e = reinterpret_cast<uintptr_t>(b + n);
    if (madvise(reinterpret_cast<void *>(a), e - a, MADV_POPULATE_WRITE) == 0) return;
    if (errno != EINVAL) throw std::bad_alloc();  // ENOMEM (EINVAL: a kernel before 5.14)
    // one write per page (of the zero already there): its fault commits it
    for (uintptr_t q = a < reinterpret_cast<uintptr_t>(b) ? a + page : a; q < e; q += page)
        *reinterpret_cast<volatile uint8_t *>(q) = 0;
    *reinterpret_cast<volatile uint8_t *>(b) = 0;
}

template <class T>
void ZeroArray<T>::release() {
    if (map_) munmap(map_, map_bytes_);
    p_ = nullptr, map_ = nullptr;
    n_ = map_bytes_ = 0;
}

template class ZeroArray<uint8_t>;
template class ZeroArray<uint16_t>;
template class ZeroArray<float>;

// MemAvailable of /proc/meminfo in bytes (0: unknown)
static size_t mem_available() {
    FILE *f = std::fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    std::fclose(f);
    return kb * 1024;
}

void Engine::use_slot(int slot) {
    if (slot_used_[(size_t)slot].load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> g(slot_mu_);  // (commit_slots, on another thread)
    if (slot_used_[(size_t)slot].load(std::memory_order_relaxed)) return;
    // A slot whose cache cannot be resident is refused with an error the caller can report (a
    // server fails that request), rather than committed until the kernel kills the process.
    const size_t bytes = (kslot_ + vslot_) * kv_el(), avail = mem_available();
    if (avail && bytes > avail)
        throw std::runtime_error("the KV cache of slot " + std::to_string(slot) + " (" + std::to_string(bytes >> 20) +
                                 " MB) does not fit in the memory available (" + std::to_string(avail >> 20) +
                                 " MB): lower the context (-c/--ctx, n_ctx=) or the slots (--parallel, n_slots=)");
    const size_t el = kv_el();
    commit_pages(kv_base(false) + kslot_ * (size_t)slot * el, kslot_ * el);
    commit_pages(kv_base(true) + vslot_ * (size_t)slot * el, vslot_ * el);
    slot_used_[(size_t)slot].store(1, std::memory_order_release);
}

void Engine::commit_slots(int n) {
    for (int s = 0; s < std::min(n, c_.n_slots); ++s) use_slot(s);
}

int Engine::slots_committed() const {
    int n = 0;
    for (int s = 0; s < c_.n_slots; ++s) n += slot_used_[(size_t)s].load(std::memory_order_acquire);
    return n;
}

int glu_kind(int ffn_act) {
    return ffn_act == FFN_RELU2 ? GLU_RELU2 : ffn_act == FFN_SWIGLU_OAI ? GLU_SWIGLU_OAI
         : ffn_act == FFN_GELU ? GLU_GEGLU : GLU_SILU;
}

Engine::Engine(const EngineConfig &c) : c_(c), layers_((size_t)c.n_layer) {
    if (c_.layer_end == 0) c_.layer_end = c.n_layer;  // not a pipeline stage: every layer
    if (c_.layer_begin < 0 || c_.layer_begin >= c_.layer_end || c_.layer_end > c.n_layer)
        throw std::invalid_argument("engine: layer range [" + std::to_string(c.layer_begin) + ", " +
                                    std::to_string(c.layer_end) + ") outside 0.." + std::to_string(c.n_layer));
    if (c.n_layer <= 0 || c.dim <= 0 || c.n_head <= 0 || c.n_kv <= 0 || c.head_dim <= 0 || c.head_dim > 512 || c.head_dim % 8 || c.ffn <= 0 ||
        c.vocab <= 0 || c.n_ctx <= 0 || c.n_head % c.n_kv != 0 || c.rope_dims <= 0 || c.rope_dims > c.head_dim ||
        c.rope_dims % 2 != 0)
        throw std::invalid_argument("engine: inconsistent model dimensions");
    if (c.ffn_act != FFN_SILU && c.ffn_act != FFN_RELU2 && c.ffn_act != FFN_SWIGLU_OAI && c.ffn_act != FFN_GELU)
        throw std::invalid_argument("engine: unknown FFN activation " + std::to_string(c.ffn_act));
    if (c.expert_gating != EXPERT_SOFTMAX && c.expert_gating != EXPERT_SOFTMAX_TOPK && c.expert_gating != EXPERT_SIGMOID)
        throw std::invalid_argument("engine: unknown expert gating " + std::to_string(c.expert_gating));
    if (c.yarn_ext_factor != 0.0f && (!(c.rope_scale > 0.0f && c.rope_scale <= 1.0f) || c.yarn_orig_ctx <= 0))
        throw std::invalid_argument("engine: YaRN needs a frequency scale in (0, 1] and an original context");
    if (c.n_slots < 1) throw std::invalid_argument("engine: n_slots must be >= 1");
    if (!c.moe_layers.empty() && c.moe_layers.size() != (size_t)c.n_layer)
        throw std::invalid_argument("engine: the MoE-layer list must have one entry per layer");
    if (c.n_dense_lead < 0 || c.n_dense_lead > c.n_layer)
        throw std::invalid_argument("engine: n_dense_lead " + std::to_string(c.n_dense_lead) + " outside 0..n_layer");
    if (!(c.embd_scale >= 0.0f) || !(c.attn_scale >= 0.0f) || !(c.rope_base_swa >= 0.0f) || !(c.logit_softcap >= 0.0f) ||
        !(c.attn_softcap >= 0.0f) || !std::isfinite(c.attn_softcap))
        throw std::invalid_argument("engine: embd_scale, attn_scale, rope_base_swa, logit_softcap and attn_softcap must be >= 0");
    if (!(c.residual_scale >= 0.0f) || !(c.logit_scale >= 0.0f) || !(c.logit_mult >= 0.0f))
        throw std::invalid_argument("engine: residual_scale, logit_scale and logit_mult must be >= 0");
    if (!(c.attn_temp_scale >= 0.0f) || (c.attn_temp_scale > 0.0f && c.attn_temp_floor <= 0))
        throw std::invalid_argument("engine: attn_temp_scale must be >= 0, with a positive attn_temp_floor");
    if (c.n_expert < 0 || (c.n_expert > 0 && (c.n_expert_used < 1 || c.n_expert_used > c.n_expert || c.expert_ffn <= 0)) ||
        c.shexp_ffn < 0)
        throw std::invalid_argument("engine: inconsistent expert counts (n_expert " + std::to_string(c.n_expert) +
                                    ", n_expert_used " + std::to_string(c.n_expert_used) + ")");
    if (c.mla_rank < 0 || c.q_lora_rank < 0 || (c.mla_rank > 0 && (c.n_kv != 1 || c.mla_v_dim <= 0 || c.rope_dims >= c.head_dim ||
                                                                   c.mla_rank % 8 || c.rope_dims % 8 || !(c.mla_kq_scale > 0.0f))))
        throw std::invalid_argument("engine: inconsistent MLA sizes (kv_lora_rank " + std::to_string(c.mla_rank) +
                                    " and rope dims multiples of 8, one KV head, rope dims < head_dim, a value width, "
                                    "a positive kq scale)");
    if (c.mla_rank > 0 && !c.recurrent.empty())
        throw std::invalid_argument("engine: MLA in a hybrid model is not supported");
    if (c.expert_groups < 0 || (c.expert_groups > 1 && (c.n_expert % c.expert_groups || c.expert_groups_used < 1 ||
                                                       c.expert_groups_used >= c.expert_groups)))
        throw std::invalid_argument("engine: expert groups " + std::to_string(c.expert_groups) + " / used " +
                                    std::to_string(c.expert_groups_used) + " do not fit " + std::to_string(c.n_expert) +
                                    " experts");
    routes_.resize((size_t)c.n_layer);
    rgap_.resize((size_t)c.n_layer);
    predicted_.assign((size_t)c.n_layer, std::vector<uint8_t>((size_t)c.n_expert, 0));
    reset_stats();
    // Hybrid layout: attention layers get KV cache rows, recurrent layers conv + delta-net states.
    if (!c.recurrent.empty() && c.recurrent.size() != (size_t)c.n_layer)
        throw std::invalid_argument("engine: the recurrent-layer list must have one entry per layer");
    if (c.ffn_ungated && c.n_expert > 0 && c.ffn_act != FFN_RELU2)  // (glu_rows' ungated epilogue is relu^2)
        throw std::invalid_argument("engine: ungated experts are relu^2 only (nemotron_h_moe)");
    if (!c.layer_parts.empty() && c.layer_parts.size() != (size_t)c.n_layer)
        throw std::invalid_argument("engine: the layer-parts list must have one entry per layer");
    if (c.ssm_parallel && (!c.mamba2 || c.recurrent.size() != (size_t)c.n_layer || !c.layer_parts.empty() ||
                           c.mla_rank > 0 ||
                           std::find(c.recurrent.begin(), c.recurrent.end(), (uint8_t)0) != c.recurrent.end()))
        throw std::invalid_argument("engine: side-by-side attention and Mamba-2 (falcon-h1) needs every layer recurrent");
    kv_index_.assign((size_t)c.n_layer, -1);
    rec_index_.assign((size_t)c.n_layer, -1);
    for (int l = 0; l < c.n_layer; ++l) {
        const bool rec = !c.recurrent.empty() && c.recurrent[(size_t)l];
        LayerWeights &L = layers_[(size_t)l];
        L.recurrent = rec;
        if (!c.layer_parts.empty()) {
            const uint8_t parts = c.layer_parts[(size_t)l];
            if (parts < 1 || parts > 3 || (rec && !(parts & 1)))
                throw std::invalid_argument("engine: layer " + std::to_string(l) + "'s parts " + std::to_string(parts) +
                                            " are not a mixer (1), an FFN (2) or both (3)");
            L.has_mixer = parts & 1;
            L.has_ffn = parts & 2;
        }
        if (l < c_.layer_begin || l >= c_.layer_end) continue;  // another pipeline stage's layer: no state here
        if (rec) rec_index_[(size_t)l] = n_rec_layers_++;
        const bool shared = !c.kv_source.empty() && c.kv_source[(size_t)l] >= 0;  // (gemma4: set below)
        if ((!rec || c.ssm_parallel) && L.has_mixer && !shared) kv_index_[(size_t)l] = n_kv_layers_++;  // (falcon-h1: both)
    }
    if (n_rec_layers_ > 0 && c.shortconv) {  // LFM2 (llama.cpp asserts l_cache > 1)
        if (c.ssm_conv < 2)
            throw std::invalid_argument("engine: the short conv's kernel width (l_cache " + std::to_string(c.ssm_conv) +
                                        ") must be at least 2");
        conv_st_.assign((size_t)c.n_slots * n_rec_layers_ * conv_state_floats(), 0.0f);
    } else if (n_rec_layers_ > 0 && c.mamba1) {  // mamba (Mamba-1)
        if (c.ssm_conv < 1 || c.ssm_state < 1 || c.ssm_inner < 1 || c.ssm_dt_rank < 1 || c.mamba2)
            throw std::invalid_argument("engine: inconsistent Mamba-1 sizes (conv kernel " + std::to_string(c.ssm_conv) +
                                        ", state " + std::to_string(c.ssm_state) + ", inner " +
                                        std::to_string(c.ssm_inner) + ", dt rank " + std::to_string(c.ssm_dt_rank) + ")");
        conv_st_.assign((size_t)c.n_slots * n_rec_layers_ * conv_state_floats(), 0.0f);
        ssm_st_.assign((size_t)c.n_slots * n_rec_layers_ * ssm_state_floats(), 0.0f);
    } else if (n_rec_layers_ > 0 && c.mamba2) {  // granitehybrid
        if (c.ssm_conv < 1 || c.ssm_state < 1 || c.ssm_groups < 1 || c.ssm_heads < 1 || c.ssm_inner < 1 ||
            c.ssm_inner % c.ssm_heads || c.ssm_heads % c.ssm_groups)
            throw std::invalid_argument("engine: inconsistent Mamba-2 sizes (conv kernel " + std::to_string(c.ssm_conv) +
                                        ", state " + std::to_string(c.ssm_state) + ", groups " +
                                        std::to_string(c.ssm_groups) + ", heads " + std::to_string(c.ssm_heads) +
                                        ", inner " + std::to_string(c.ssm_inner) + ")");
        conv_st_.assign((size_t)c.n_slots * n_rec_layers_ * conv_state_floats(), 0.0f);
        ssm_st_.assign((size_t)c.n_slots * n_rec_layers_ * ssm_state_floats(), 0.0f);
    } else if (n_rec_layers_ > 0) {
        if (c.ssm_conv < 1 || c.ssm_state < 1 || c.ssm_groups < 1 || c.ssm_heads < 1 || c.ssm_heads % c.ssm_groups)
            throw std::invalid_argument("engine: inconsistent delta-net sizes (conv kernel " + std::to_string(c.ssm_conv) +
                                        ", state " + std::to_string(c.ssm_state) + ", groups " +
                                        std::to_string(c.ssm_groups) + ", heads " + std::to_string(c.ssm_heads) + ")");
        conv_st_.assign((size_t)c.n_slots * n_rec_layers_ * conv_state_floats(), 0.0f);
        ssm_st_.assign((size_t)c.n_slots * n_rec_layers_ * ssm_state_floats(), 0.0f);
    }
    rpos_.assign((size_t)c.n_slots, 0);
    tlog_p0_.assign((size_t)c.n_slots, 0);
    tlog_n_.assign((size_t)c.n_slots, 0);
    kv_row_ = c.mla_rank > 0 ? (size_t)c.mla_rank + c.rope_dims : (size_t)c.n_kv * c.head_dim;
    if (!c.layer_kv.empty() || !c.layer_hd.empty()) {  // gemma4: per-layer KV heads and head widths
        if (c.layer_kv.size() != (size_t)c.n_layer || c.layer_hd.size() != (size_t)c.n_layer || c.mla_rank > 0)
            throw std::invalid_argument("engine: the per-layer KV head and head width lists need one entry per layer "
                                        "(and no MLA)");
        for (int l = 0; l < c.n_layer; ++l) {
            const int kv = c.layer_kv[(size_t)l], hd = c.layer_hd[(size_t)l];
            if (kv <= 0 || kv > c.n_kv || c.n_head % kv || hd <= 0 || hd > c.head_dim || hd % 8)
                throw std::invalid_argument("engine: layer " + std::to_string(l) + "'s " + std::to_string(kv) +
                                            " KV heads of " + std::to_string(hd) + " dims do not fit n_head " +
                                            std::to_string(c.n_head) + " (at most n_kv heads of head_dim, a multiple of 8)");
        }
    }
    if (c.rope_dims_swa < 0 || c.rope_dims_swa % 2)
        throw std::invalid_argument("engine: rope_dims_swa must be an even number >= 0");
    for (int l = 0; l < c.n_layer; ++l) {
        qd_max_ = std::max(qd_max_, (size_t)c.n_head * hd_of(l));
        kd_max_ = std::max(kd_max_, (size_t)kv_of(l) * hd_of(l));
    }
    auto kv_type_ok = [](int t) { return t == T_F16 || t == T_Q8_0 || t == T_Q4_0; };
    if (!kv_type_ok(c.kv_k) || !kv_type_ok(c.kv_v))
        throw std::invalid_argument("engine: the KV cache types must be f16, q8_0 or q4_0");
    if (c.mla_rank > 0 && !c.kv_f16)
        throw std::invalid_argument("engine: MLA's latent cache is half only (kv_f16)");
    if (kv_quant()) {
        if (c.mla_rank > 0)
            throw std::invalid_argument("engine: MLA's latent cache is f16 only (no q8_0 / q4_0 KV for deepseek2 yet)");
        for (int l = 0; l < c.n_layer; ++l)
            if (hd_of(l) % QK)
                throw std::invalid_argument("engine: a q8_0 / q4_0 KV cache needs head_dim a multiple of 32 (this model's is " +
                                            std::to_string(hd_of(l)) + ")");
        if (c.kv_k == T_F16)
            throw std::invalid_argument("engine: a quantized V cache needs a quantized K cache (kv_k q8_0 or q4_0)");
    }
    // The cache's layout: per slot, each attention layer's K (V) heads, each n_ctx head rows
    // (engine.h kv_k_at); a row's elements (half / float) or bytes (quantized)
    auto row = [&](int t, int hd) { return t == T_F16 ? (size_t)hd * 2 : row_bytes(format_by_id(t), hd); };
    kvl_.assign((size_t)n_kv_layers_, KvLayer{});
    for (int l = 0; l < c.n_layer; ++l) {
        if (kv_index_[(size_t)l] < 0) continue;
        KvLayer &g = kvl_[(size_t)kv_index_[(size_t)l]];
        g.heads = c.mla_rank > 0 ? 1 : kv_of(l);
        g.hd = c.mla_rank > 0 ? (int)kv_row_ : hd_of(l);
        g.krow = kv_quant() ? row(c.kv_k, g.hd) : (size_t)g.hd;
        g.vrow = kv_quant() ? row(c.kv_v, g.hd) : c.mla_rank > 0 ? 0 : (size_t)g.hd;  // (MLA: V is K's rows)
        g.k0 = kslot_;
        g.v0 = vslot_;
        kslot_ += (size_t)g.heads * c.n_ctx * g.krow;
        vslot_ += (size_t)g.heads * c.n_ctx * g.vrow;
    }
    // gemma4's shared KV: a layer reads an earlier layer's rows (same geometry, this stage's)
    if (!c.kv_source.empty() && c.kv_source.size() != (size_t)c.n_layer)
        throw std::invalid_argument("engine: the KV-source list must have one entry per layer");
    for (int l = 0; l < c.n_layer && !c.kv_source.empty(); ++l) {
        const int src = c.kv_source[(size_t)l];
        if (src < 0 || l < c_.layer_begin || l >= c_.layer_end) continue;
        if (src >= l || src < c_.layer_begin || kv_index_[(size_t)src] < 0 || c.kv_source[(size_t)src] >= 0 ||
            hd_of(src) != hd_of(l) || kv_of(src) != kv_of(l) || c.mla_rank > 0)
            throw std::invalid_argument("engine: layer " + std::to_string(l) + " cannot read layer " +
                                        std::to_string(src) + "'s KV (an earlier attention layer of this stage "
                                        "with its own cache and the same heads)");
        kv_index_[(size_t)l] = kv_index_[(size_t)src];
    }
    if (!c.layer_ffn.empty()) {
        if (c.layer_ffn.size() != (size_t)c.n_layer)
            throw std::invalid_argument("engine: the per-layer FFN widths need one entry per layer");
        for (int f : c.layer_ffn)
            if (f <= 0 || f > c.ffn) throw std::invalid_argument("engine: a layer's FFN width is outside 1..ffn");
    }
    if (c.ple_dim < 0 || (c.ple_dim > 0 && (c.layer_begin != 0 || c_.layer_end != c.n_layer)))
        throw std::invalid_argument("engine: per-layer embeddings need every layer in one engine (no pipeline stages)");
    if (c.altup < 0 || c.altup == 1 || c.altup > 8 || (c.altup > 0 && (c.ple_dim <= 0 || c.altup_act < 0 || c.altup_act >= c.altup)) ||
        c.sparse_layers < 0 || c.sparse_layers > c.n_layer)
        throw std::invalid_argument("engine: altup streams must be 0 or 2..8 with per-layer embeddings and an active "
                                    "stream among them; sparse layers within 0..n_layer");
    const size_t kn = (size_t)c.n_slots * kslot_, vn = (size_t)c.n_slots * vslot_;
    // The cache on 2 MB pages (transparent huge pages) where a slot's K or V takes at least 8 MB: a
    // step writes and reads each slot's rows of every layer and head, far apart, so on 4 KB pages
    // nearly every head's rows are TLB misses (the writes on the caller's thread, while the others
    // wait); the default model at 800 positions: 16-token steps 1.13x, one-token steps 1.14x
    // faster (BENCHMARKS.md, round 24). Below 8 MB a slot's first use would commit much of its
    // neighbours' memory. LOWBIT_KV_HUGE=0: 4 KB pages.
    static const bool huge_ok = [] {
        const char *e = std::getenv("LOWBIT_KV_HUGE");
        return !(e && std::strcmp(e, "0") == 0);
    }();
    const bool huge = huge_ok && std::min(kslot_, vslot_) * kv_el() >= (size_t)8 << 20;
    if (kv_quant()) { kq_.reset(kn, huge); vq_.reset(vn, huge); }
    else if (c.kv_f16) { k16_.reset(kn, huge); v16_.reset(vn, huge); }
    else { k32_.reset(kn, huge); v32_.reset(vn, huge); }
    slot_used_.reset(new std::atomic<uint8_t>[(size_t)c.n_slots]);
    for (int s = 0; s < c.n_slots; ++s) slot_used_[(size_t)s].store(0, std::memory_order_relaxed);
    inv_freq_.resize(c.rope_dims / 2);
    for (int i = 0; i < c.rope_dims / 2; ++i)
        inv_freq_[i] = (float)std::pow((double)c.rope_base, -2.0 * i / c.rope_dims);
    rope_pos_scale_ = c.rope_scale;
    if (c.yarn_ext_factor != 0.0f) {
        // llama.cpp's YaRN (ggml's rope_yarn): theta = theta_extrap * (fs (1 - mix) + mix) per
        // pair i, mix = ramp(i) * ext_factor over the correction dims [lo, hi] (float, as
        // ggml_rope_yarn_corr_dims computes them); cos / sin times mscale.
        const float fs = c.rope_scale, nd = (float)c.rope_dims, pi = 3.14159265358979323846f;
        auto corr = [&](float beta) {
            return nd * std::log((float)c.yarn_orig_ctx / (beta * 2.0f * pi)) / (2.0f * std::log(c.rope_base));
        };
        const float lo = std::max(0.0f, std::floor(corr(c.yarn_beta_fast)));
        const float hi = std::min(nd - 1.0f, std::ceil(corr(c.yarn_beta_slow)));
        for (int i = 0; i < c.rope_dims / 2; ++i) {
            const float y = ((float)i - lo) / std::max(0.001f, hi - lo);
            const float mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * c.yarn_ext_factor;
            inv_freq_[i] = (float)((double)inv_freq_[i] * ((double)fs * (1.0 - mix) + mix));
        }
        rope_pos_scale_ = 1.0f;
        rope_mscale_ = c.yarn_attn_factor * (1.0f + 0.1f * std::log(1.0f / fs));
    } else {
        rope_mscale_ = c.yarn_attn_factor;  // rope.scaling.attn_factor alone (LongRoPE, phi3); else 1
    }
    // gemma3's sliding layers: their own base, frequency scale 1 (llama.cpp's
    // get_rope_freq_base / _scale of a swa layer: rope_freq_base_train_swa, 1)
    if (c.rope_base_swa > 0.0f) {
        // (YaRN on the other layers or not: OLMo 3's sliding layers rotate plainly, no mscale)
        const int nd = rope_dims_swa();  // (gemma4: its own rotated dims)
        inv_freq_swa_.resize(nd / 2);
        for (int i = 0; i < nd / 2; ++i)
            inv_freq_swa_[i] = (float)std::pow((double)c.rope_base_swa, -2.0 * i / nd);
    }
    // IMROPE (ggml's mrope cache with is_imrope): pair i of sector i % sum(sections) takes the
    // 1st section's position if sector % 3 == 0 and sector < 3 s0, the 2nd's if == 1 and < 3 s1,
    // the 3rd's if == 2 and < 3 s2, else the 4th's, which is 0 for text tokens.
    rope_zero_.assign((size_t)c.rope_dims / 2, 0);
    const int *sec = c.rope_sections, sect_dims = sec[0] + sec[1] + sec[2] + sec[3];
    if (sect_dims > 0)
        for (int i = 0; i < c.rope_dims / 2; ++i) {
            const int s = i % sect_dims;
            const bool pos_p = (s % 3 == 1 && s < 3 * sec[1]) || (s % 3 == 2 && s < 3 * sec[2]) || (s % 3 == 0 && s < 3 * sec[0]);
            rope_zero_[(size_t)i] = !pos_p;
        }
}

static Mat *mat_slot(LayerWeights &l, const std::string &n) {
    if (n == "attn_q") return &l.wq;
    if (n == "attn_k") return &l.wk;
    if (n == "attn_v") return &l.wv;
    if (n == "attn_output") return &l.wo;
    if (n == "ffn_gate") return &l.wgate;
    if (n == "ffn_up") return &l.wup;
    if (n == "ffn_down") return &l.wdown;
    if (n == "ffn_gate_inp") return &l.router;
    if (n == "ffn_gate_exps") return &l.gate_exps;
    if (n == "ffn_up_exps") return &l.up_exps;
    if (n == "ffn_down_exps") return &l.down_exps;
    if (n == "ffn_gate_shexp") return &l.sh_gate;
    if (n == "ffn_up_shexp") return &l.sh_up;
    if (n == "ffn_down_shexp") return &l.sh_down;
    if (n == "ffn_gate_inp_shexp") return &l.sh_gate_inp;
    if (n == "attn_qkv") return &l.wqkv;
    if (n == "attn_gate") return &l.wqkv_gate;
    if (n == "ssm_alpha") return &l.ssm_alpha;
    if (n == "ssm_beta") return &l.ssm_beta;
    if (n == "ssm_ba") return &l.ssm_ba;
    if (n == "ssm_out") return &l.ssm_out;
    if (n == "ssm_in") return &l.ssm_in;  // Mamba-2 (csrc/mamba2.cpp), Mamba-1 (csrc/mamba1.cpp)
    if (n == "ssm_x") return &l.ssm_x;    // Mamba-1
    if (n == "ssm_dt") return &l.ssm_dtw;
    if (n == "shortconv.in_proj") return &l.sc_in;  // LFM2 (csrc/shortconv.cpp)
    if (n == "shortconv.out_proj") return &l.sc_out;
    if (n == "attn_q_a") return &l.wq_a;     // DeepSeek MLA (csrc/mla.cpp)
    if (n == "attn_q_b") return &l.wq_b;
    if (n == "attn_kv_a_mqa") return &l.wkv_a;
    if (n == "attn_k_b") return &l.wk_b;
    if (n == "attn_v_b") return &l.wv_b;
    if (n == "per_layer_inp_gate") return &l.ple_gate;  // gemma4 E2B / E4B
    if (n == "per_layer_proj") return &l.ple_proj;
    if (n == "laurel_l") return &l.laurel_l;  // gemma3n
    if (n == "laurel_r") return &l.laurel_r;
    return nullptr;
}

// m's rows into the selected level's repacked layout for its format, if there is one and it
// takes m: every block of block_rows rows (the whole matrix, or one expert's) a multiple of the
// layout's 8 rows. The copy is the engine's (repacked_), built by the pool's threads; m.w and
// m.k then point to it and its kernels. Nothing else reads a matrix's bytes but its kernels
// (embeddings, read row by row by dequant, are never repacked).
void Engine::repack(Mat &m, int64_t block_rows) {
    const KernelEntry *k = repack_on_ ? repacked_entry(m.type) : nullptr;
    if (!k || m.rows <= 0 || m.rows % kR8Rows || block_rows <= 0 || block_rows % kR8Rows || !r8_takes(m.type, m.n)) return;
    const size_t bytes = (size_t)m.rows * m.stride;
    uint8_t *p = repacked_bytes(bytes);
    const int64_t groups = m.rows / kR8Rows;
    const uint8_t *src = m.w;
    const size_t stride = m.stride;
    const int64_t n = m.n;
    const int type = m.type;
    ThreadPool::instance().run(ThreadPool::instance().size(), [&](int i, int nth) {
        int64_t g0, g1;
        split_range(groups, i, nth, &g0, &g1);
        repack_r8(type, src + (size_t)g0 * kR8Rows * stride, stride, (g1 - g0) * kR8Rows, n,
                  p + (size_t)g0 * kR8Rows * stride);
    });
    repacked_src_.emplace_back(m.w, bytes);
    m.src = m.w;
    m.w = p;
    m.k = k;
}

// 64-byte aligned room for a repacked matrix, from the current arena or a new one
uint8_t *Engine::repacked_bytes(size_t bytes) {
    const size_t need = (bytes + 63) / 64 * 64;
    if (need > arena_left_) {
        const size_t size = std::max<size_t>(need, (size_t)64 << 20);
        uint8_t *a = alloc_repacked(size);
        repacked_.emplace_back(a, [](uint8_t *q) { std::free(q); });
        arena_next_ = a, arena_left_ = size;
    }
    uint8_t *p = arena_next_;
    arena_next_ += need, arena_left_ -= need;
    return p;
}

void Engine::set_mat(const std::string &name, int layer, const Mat &m) {
    const Format *f = format_by_id(m.type);
    if (!f || !f->weight || m.n % f->block || row_bytes(f, m.n) != m.stride)
        throw std::invalid_argument("engine: " + name + ": bad weight matrix");
    if (layer < 0) {
        if (name == "token_embd") { embd_ = m; return; }
        if (name == "output") { output_ = m; repack(output_, output_.rows); return; }
        if (name == "per_layer_token_embd") { ple_embd_ = m; return; }  // gemma4 E2B / E4B
        if (name == "per_layer_model_proj") { ple_model_proj_ = m; return; }
        if (name == "altup_proj" && c_.altup > 0) { altup_proj_ = m; return; }  // gemma3n
        if (name == "altup_unembd_proj" && c_.altup > 0) { altup_unembd_ = m; return; }
    } else if (layer < c_.n_layer) {
        if (Mat *s = mat_slot(layers_[(size_t)layer], name)) {
            const float keep = s->out_scale;  // set by a "<name>.scale" vector, in any order
            *s = m;
            s->out_scale = keep;
            // the experts' 3-D tensors: each expert's rows are a block of their own
            const bool exps = name == "ffn_gate_exps" || name == "ffn_up_exps" || name == "ffn_down_exps";
            const int64_t per = !exps ? m.rows : name == "ffn_down_exps" ? c_.dim : c_.expert_ffn;
            if (!exps || (c_.n_expert > 0 && m.rows == (int64_t)c_.n_expert * per)) repack(*s, per);
            return;
        }
    }
    throw std::invalid_argument("engine: unknown matrix " + name);
}

// A recurrent layer's conv taps ssm_conv1d [channels][K], and their copy per block of kConvBlock
// channels transposed (tap j of channel c0 + i at [block][j][i], 0 past the last channel), which
// conv_runs reads: built once here, not per call.
void Engine::set_conv_taps(LayerWeights &l, const float *v, int64_t len) {
    const int K = c_.ssm_conv;
    const int64_t ch = len / K, nblk = (ch + kConvBlock - 1) / kConvBlock;
    l.ssm_conv1d = v;
    l.conv_wT.assign((size_t)(nblk * K * kConvBlock), 0.0f);
    for (int64_t c = 0; c < ch; ++c)
        for (int j = 0; j < K; ++j)
            l.conv_wT[(size_t)(((c / kConvBlock) * K + j) * kConvBlock + c % kConvBlock)] = v[c * K + j];
}

void Engine::set_vec(const std::string &name, int layer, const float *v, int64_t len) {
    auto need = [&](int64_t want) {
        if (len != want)
            throw std::invalid_argument("engine: " + name + " has " + std::to_string(len) + " values, expected " +
                                        std::to_string(want));
    };
    if (layer < 0) {
        if (name == "output_norm") { need(c_.dim); out_norm_ = v; return; }
        if (name == "output_norm.bias" && c_.layer_norm) { need(c_.dim); out_norm_b_ = v; return; }
        if (name == "output.bias") { need(c_.vocab); out_b_ = v; return; }
        if (name == "per_layer_proj_norm" && c_.ple_dim > 0) { need(c_.ple_dim); ple_proj_norm_ = v; return; }
        if (name == "rope_freqs") { need(c_.rope_dims / 2);  // per-pair frequency factors (llama3, phi3 LongRoPE)
            for (int i = 0; i < c_.rope_dims / 2; ++i)
                inv_freq_[i] = (float)(std::pow((double)c_.rope_base, -2.0 * i / c_.rope_dims) / v[i]);
            return; }
    } else if (layer < c_.n_layer) {
        LayerWeights &l = layers_[(size_t)layer];
        const int hd = hd_of(layer), qd = c_.n_head * hd, kd = kv_of(layer) * hd;
        if (name == "attn_norm") { need(c_.dim); l.attn_norm = v; return; }
        if (name == "ffn_norm") { need(c_.dim); l.ffn_norm = v; return; }
        if (c_.layer_norm && name == "attn_norm.bias") { need(c_.dim); l.attn_norm_b = v; return; }
        if (c_.layer_norm && name == "ffn_norm.bias") { need(c_.dim); l.ffn_norm_b = v; return; }
        if (c_.ffn_ungated && name == "ffn_up.bias") { need(ffn_of(layer)); l.ffn_up_b = v; return; }
        if (c_.ffn_ungated && name == "ffn_down.bias") { need(c_.dim); l.ffn_down_b = v; return; }
        if (c_.layer_norm && (name == "attn_q_norm" || name == "attn_k_norm")) {  // Command R+: one row per head
            need(name == "attn_q_norm" ? qd : kd);
            (name == "attn_q_norm" ? l.q_norm : l.k_norm) = v;
            return;
        }
        if (name == "attn_q_norm") { need(c_.qk_norm_full ? qd : hd); l.q_norm = v; return; }
        if (name == "attn_k_norm") { need(c_.qk_norm_full ? kd : hd); l.k_norm = v; return; }
        if (name == "layer_output_scale") { need(1); l.out_scale = v; return; }  // gemma4
        if (name == "per_layer_post_norm" && c_.ple_dim > 0) { need(c_.dim); l.ple_post_norm = v; return; }
        if (c_.altup > 0) {  // gemma3n
            const int64_t A = c_.altup;
            if (name == "altup_router") { need(A * c_.dim); l.altup_router = v; return; }
            if (name == "altup_router_norm") { need(c_.dim); l.altup_router_norm = v; return; }
            if (name == "altup_predict_coef") { need(A * A * A); l.altup_predict = v; return; }
            if (name == "altup_correct_coef") { need(A * A); l.altup_correct = v; return; }
            if (name == "altup_correct_scale") { need(c_.dim); l.altup_correct_scale = v; return; }
            if (name == "laurel_post_norm") { need(c_.dim); l.laurel_post_norm = v; return; }
        }
        if (c_.moe_mlp) {  // gemma4's MoE layers
            if (name == "ffn_post_norm_1") { need(c_.dim); l.ffn_post_norm_1 = v; return; }
            if (name == "ffn_pre_norm_2") { need(c_.dim); l.ffn_pre_norm_2 = v; return; }
            if (name == "ffn_post_norm_2") { need(c_.dim); l.ffn_post_norm_2 = v; return; }
            if (name == "router_in_scale") { need(c_.dim); l.router_in_scale = v; return; }
            if (name == "down_exps_scale") { need(c_.n_expert); l.down_exps_s = v; return; }
        }
        if (name == "attn_q.bias") { need(qd); l.bq = v; return; }
        if (name == "attn_k.bias") { need(kd); l.bk = v; return; }
        if (name == "attn_v.bias") { need(kd); l.bv = v; return; }
        if (name == "attn_sub_norm") { need(qd); l.attn_sub_norm = v; return; }
        if (name == "ffn_sub_norm") { need(c_.ffn); l.ffn_sub_norm = v; return; }
        if (name == "attn_sinks") { need(c_.n_head); l.attn_sinks = v; return; }
        if (name == "attn_output.bias") { need(c_.dim); l.bo = v; return; }
        if (name == "attn_post_norm") { need(c_.dim); l.attn_post_norm = v; return; }  // gemma3
        if (name == "ffn_post_norm") { need(c_.dim); l.ffn_post_norm = v; return; }
        if (name == "attn_q_a_norm" && c_.q_lora_rank > 0) { need(c_.q_lora_rank); l.q_a_norm = v; return; }  // MLA
        if (name == "attn_kv_a_norm" && c_.mla_rank > 0) { need(c_.mla_rank); l.kv_a_norm = v; return; }
        if (name == "exp_probs_b" && c_.n_expert > 0) { need(c_.n_expert); l.exp_probs_b = v; return; }  // glm4moe
        if (l.recurrent && c_.shortconv) {  // LFM2
            if (name == "shortconv.conv") { need((int64_t)c_.dim * c_.ssm_conv); set_conv_taps(l, v, len); return; }
        } else if (l.recurrent && c_.mamba1) {
            const int64_t di = c_.ssm_inner;
            if (name == "ssm_conv1d") { need(di * c_.ssm_conv); set_conv_taps(l, v, len); return; }
            if (name == "ssm_conv1d.bias") { need(di); l.ssm_conv1d_b = v; return; }
            if (name == "ssm_dt.bias") { need(di); l.ssm_dt = v; return; }
            if (name == "ssm_a") { need(di * c_.ssm_state); l.ssm_a = v; return; }
            if (name == "ssm_d") { need(di); l.ssm_d = v; return; }
            if (name == "ssm_dt_norm") { need(c_.ssm_dt_rank); l.ssm_dt_norm = v; return; }  // jamba
            if (name == "ssm_b_norm") { need(c_.ssm_state); l.ssm_b_norm = v; return; }
            if (name == "ssm_c_norm") { need(c_.ssm_state); l.ssm_c_norm = v; return; }
        } else if (l.recurrent && c_.mamba2) {
            const int64_t H = c_.ssm_heads, cd = conv_dim();
            if (name == "ssm_conv1d") { need(cd * c_.ssm_conv); set_conv_taps(l, v, len); return; }
            if (name == "ssm_conv1d.bias") { need(cd); l.ssm_conv1d_b = v; return; }
            if (name == "ssm_dt.bias") { need(H); l.ssm_dt = v; return; }
            if (name == "ssm_a") { need(H); l.ssm_a = v; return; }
            if (name == "ssm_d") { need(H); l.ssm_d = v; return; }
            if (name == "ssm_norm") { need(c_.ssm_inner); l.ssm_norm = v; return; }
        } else if (l.recurrent) {
            const int64_t S = c_.ssm_state, Hv = c_.ssm_heads, cd = (2 * (int64_t)c_.ssm_groups + Hv) * S;
            if (name == "ssm_conv1d") { need(cd * c_.ssm_conv); set_conv_taps(l, v, len); return; }
            if (name == "ssm_dt.bias") { need(Hv); l.ssm_dt = v; return; }
            if (name == "ssm_a") { need(Hv); l.ssm_a = v; return; }
            if (name == "ssm_norm") { need(S); l.ssm_norm = v; return; }
        }
        if (c_.n_expert > 0) {
            const int64_t E = c_.n_expert;
            if (name == "ffn_gate_inp.bias") { need(E); l.router_b = v; return; }
            if (name == "ffn_gate_exps.bias") { need(E * c_.expert_ffn); l.gate_exps_b = v; return; }
            if (name == "ffn_up_exps.bias") { need(E * c_.expert_ffn); l.up_exps_b = v; return; }
            if (name == "ffn_down_exps.bias") { need(E * c_.dim); l.down_exps_b = v; return; }
        }
        // "<matrix>.scale": one float multiplying that matrix's output (llama.cpp's bitnet)
        const size_t dot = name.rfind(".scale");
        if (dot != std::string::npos && dot + 6 == name.size()) {
            if (Mat *s = mat_slot(l, name.substr(0, dot))) {
                need(1);
                if (!std::isfinite(v[0])) throw std::invalid_argument("engine: " + name + " is not finite");
                s->out_scale = v[0];
                return;
            }
        }
    }
    throw std::invalid_argument("engine: unknown vector " + name);
}

void Engine::set_window(int layer, int window) {
    if (layer < 0 || layer >= c_.n_layer) throw std::invalid_argument("engine: set_window: no layer " + std::to_string(layer));
    if (window < 0) throw std::invalid_argument("engine: set_window: negative window");
    layers_[(size_t)layer].window = window;
}

// The residual stream plus a block's output of T tokens (granite: the output times residual_scale
// first, as its graph's ggml_scale before the add).
void Engine::residual(const float *out, int64_t T) {
    const size_t n = (size_t)T * c_.dim;
    if (c_.residual_scale > 0.0f)
        for (size_t i = 0; i < n; ++i) x_[i] += out[i] * c_.residual_scale;
    else
        for (size_t i = 0; i < n; ++i) x_[i] += out[i];
}

// A block's input h_ from the residual x_: its RMSNorm, or (no pre-norms, olmo2) x_ as it is.
void Engine::pre_norm(const float *w, const float *b, int64_t T) {
    if (c_.pre_norms) norm(x_.data(), w, b, h_.data(), T, c_.dim);
    else std::memcpy(h_.data(), x_.data(), sizeof(float) * (size_t)T * c_.dim);
}

void Engine::set_rope(int layer, bool on) {
    if (layer < 0 || layer >= c_.n_layer) throw std::invalid_argument("engine: set_rope: no layer " + std::to_string(layer));
    layers_[(size_t)layer].rope = on;
}

std::string Engine::validate() const {
    auto shape = [](const Mat &m, int64_t rows, int64_t n, const std::string &what) -> std::string {
        if (!m.present()) return what + " is missing";
        if (m.rows != rows || m.n != n)
            return what + " has shape [" + std::to_string(m.rows) + ", " + std::to_string(m.n) + "], expected [" +
                   std::to_string(rows) + ", " + std::to_string(n) + "]";
        return "";
    };
    const int qd = c_.n_head * c_.head_dim;  // (MLA's)
    auto attn_shapes = [&](int i, const LayerWeights &l, const std::string &p) -> std::string {  // q, k, v, output
        const int qd = c_.n_head * hd_of(i), kd = kv_of(i) * hd_of(i);
        std::string e;
        if (!(e = shape(l.wq, c_.attn_gate ? 2 * qd : qd, c_.dim, p + "attn_q")).empty()) return e;
        if (kv_shared(i)) {  // (gemma4: q alone; k and v are an earlier layer's)
        } else if (!(e = shape(l.wk, kd, c_.dim, p + "attn_k")).empty()) {
            return e;
        } else if ((l.wv.present() || !c_.v_norm) && !(e = shape(l.wv, kd, c_.dim, p + "attn_v")).empty()) {
            return e;
        }
        const int dims = l.window > 0 && !inv_freq_swa_.empty() ? rope_dims_swa() : c_.rope_dims;
        if (l.rope && dims > hd_of(i))
            return "layer " + std::to_string(i) + " rotates " + std::to_string(dims) + " dims of " + std::to_string(hd_of(i)) + "-dim heads";
        return shape(l.wo, c_.dim, qd, p + "attn_output");
    };
    std::string e;
    if (c_.layer_begin == 0 && !(e = shape(embd_, c_.vocab, c_.dim, "token_embd")).empty()) return e;
    if (c_.ple_dim > 0) {
        const int64_t w = (int64_t)c_.ple_dim * c_.n_layer;
        if (!(e = shape(ple_embd_, c_.vocab, w, "per_layer_token_embd")).empty()) return e;
        if (!(e = shape(ple_model_proj_, w, c_.dim, "per_layer_model_proj")).empty()) return e;
        if (!ple_proj_norm_) return "per_layer_proj_norm is missing";
    }
    if (c_.altup > 0) {  // gemma3n's streams
        const int64_t rows = (int64_t)(c_.altup - 1) * c_.dim;
        if (!(e = shape(altup_proj_, rows, c_.dim, "altup_proj")).empty()) return e;
        if (!(e = shape(altup_unembd_, rows, c_.dim, "altup_unembd_proj")).empty()) return e;
    }
    if (c_.layer_end == c_.n_layer) {
        if (!(e = shape(output_, c_.vocab, c_.dim, "output")).empty()) return e;
        if (!out_norm_) return "output_norm is missing";
    }
    for (int i = c_.layer_begin; i < c_.layer_end; ++i) {
        const LayerWeights &l = layers_[(size_t)i];
        const std::string p = "blk." + std::to_string(i) + ".";
        if (c_.pre_norms && ((l.has_mixer && !l.attn_norm) || (l.has_ffn && !l.ffn_norm && !c_.parallel_ffn)))
            return p + "attn_norm/ffn_norm missing";
        if (c_.sub_norm && !l.attn_sub_norm) return p + "attn_sub_norm is missing";
        if (c_.sub_norm && !l.ffn_sub_norm) return p + "ffn_sub_norm is missing";
        if (!l.has_mixer) {  // (an FFN-only layer)
        } else if (l.recurrent && c_.shortconv) {
            if (!(e = shape(l.sc_in, 3 * (int64_t)c_.dim, c_.dim, p + "shortconv.in_proj")).empty()) return e;
            if (!(e = shape(l.sc_out, c_.dim, c_.dim, p + "shortconv.out_proj")).empty()) return e;
            if (!l.ssm_conv1d) return p + "shortconv.conv is missing";
        } else if (l.recurrent && c_.mamba1) {
            const int64_t di = c_.ssm_inner, N = c_.ssm_state, R = c_.ssm_dt_rank;
            if (!(e = shape(l.ssm_in, 2 * di, c_.dim, p + "ssm_in")).empty()) return e;
            if (!(e = shape(l.ssm_x, R + 2 * N, di, p + "ssm_x")).empty()) return e;
            if (!(e = shape(l.ssm_dtw, di, R, p + "ssm_dt")).empty()) return e;
            if (!(e = shape(l.ssm_out, c_.dim, di, p + "ssm_out")).empty()) return e;
            if (!l.ssm_conv1d || !l.ssm_conv1d_b || !l.ssm_dt || !l.ssm_a || !l.ssm_d)
                return p + "ssm_conv1d/ssm_conv1d.bias/ssm_dt.bias/ssm_a/ssm_d missing";
            if ((l.ssm_dt_norm != nullptr) != (l.ssm_b_norm != nullptr) || (l.ssm_b_norm != nullptr) != (l.ssm_c_norm != nullptr))
                return p + "ssm_dt_norm / ssm_b_norm / ssm_c_norm: all three or none";
        } else if (l.recurrent && c_.mamba2) {
            const int64_t H = c_.ssm_heads, di = c_.ssm_inner, cd = conv_dim();
            if (!(e = shape(l.ssm_in, di + cd + H, c_.dim, p + "ssm_in")).empty()) return e;
            if (!(e = shape(l.ssm_out, c_.dim, di, p + "ssm_out")).empty()) return e;
            if (!l.ssm_conv1d || !l.ssm_dt || !l.ssm_a || !l.ssm_d || (!l.ssm_norm && !c_.ssm_parallel))
                return p + "ssm_conv1d/ssm_dt/ssm_a/ssm_d/ssm_norm missing";
            if (c_.ssm_parallel && !(e = attn_shapes(i, l, p)).empty()) return e;  // (and its attention beside)
        } else if (l.recurrent) {
            const int64_t S = c_.ssm_state, Hv = c_.ssm_heads, vd = Hv * S, cd = 2 * (int64_t)c_.ssm_groups * S + vd;
            if (!(e = shape(l.wqkv, cd, c_.dim, p + "attn_qkv")).empty()) return e;
            if (!(e = shape(l.wqkv_gate, vd, c_.dim, p + "attn_gate")).empty()) return e;
            if (l.ssm_ba.present()) {
                if (!(e = shape(l.ssm_ba, 2 * Hv, c_.dim, p + "ssm_ba")).empty()) return e;
            } else {
                if (!(e = shape(l.ssm_alpha, Hv, c_.dim, p + "ssm_alpha")).empty()) return e;
                if (!(e = shape(l.ssm_beta, Hv, c_.dim, p + "ssm_beta")).empty()) return e;
            }
            if (!(e = shape(l.ssm_out, c_.dim, vd, p + "ssm_out")).empty()) return e;
            if (!l.ssm_conv1d || !l.ssm_dt || !l.ssm_a || !l.ssm_norm) return p + "ssm_conv1d/ssm_dt/ssm_a/ssm_norm missing";
        } else if (mla()) {
            const int64_t R = c_.mla_rank, rope = c_.rope_dims, nope = c_.head_dim - rope, vd = c_.mla_v_dim;
            if (c_.q_lora_rank > 0) {
                if (!(e = shape(l.wq_a, c_.q_lora_rank, c_.dim, p + "attn_q_a")).empty()) return e;
                if (!(e = shape(l.wq_b, qd, c_.q_lora_rank, p + "attn_q_b")).empty()) return e;
                if (!l.q_a_norm) return p + "attn_q_a_norm is missing";
            } else if (!(e = shape(l.wq, qd, c_.dim, p + "attn_q")).empty()) return e;
            if (!(e = shape(l.wkv_a, R + rope, c_.dim, p + "attn_kv_a_mqa")).empty()) return e;
            if (!l.kv_a_norm) return p + "attn_kv_a_norm is missing";
            if (!(e = shape(l.wk_b, c_.n_head * R, nope, p + "attn_k_b")).empty()) return e;
            if (!(e = shape(l.wv_b, c_.n_head * vd, R, p + "attn_v_b")).empty()) return e;
            if (!(e = shape(l.wo, c_.dim, c_.n_head * vd, p + "attn_output")).empty()) return e;
        } else if (!(e = attn_shapes(i, l, p)).empty()) {
            return e;
        }
        if (c_.post_norms && !l.attn_post_norm) return p + "post_attention_norm is missing";
        if (c_.post_norms && !l.ffn_post_norm) return p + "post_ffw_norm is missing";
        if (!l.has_ffn) {  // (a mixer-only layer)
        } else if (moe_layer(i)) {
            const int64_t E = c_.n_expert, ef = c_.expert_ffn;
            if (!(e = shape(l.router, E, c_.dim, p + "ffn_gate_inp")).empty()) return e;
            // the 3-D tensors arrive flattened: [n_expert * rows, n]
            if (!c_.ffn_ungated && !(e = shape(l.gate_exps, E * ef, c_.dim, p + "ffn_gate_exps")).empty()) return e;
            if (!(e = shape(l.up_exps, E * ef, c_.dim, p + "ffn_up_exps")).empty()) return e;
            if (!(e = shape(l.down_exps, E * c_.dim, ef, p + "ffn_down_exps")).empty()) return e;
            if (c_.shexp_ffn > 0) {
                if (!c_.ffn_ungated && !(e = shape(l.sh_gate, c_.shexp_ffn, c_.dim, p + "ffn_gate_shexp")).empty())
                    return e;
                if (!(e = shape(l.sh_up, c_.shexp_ffn, c_.dim, p + "ffn_up_shexp")).empty()) return e;
                if (!(e = shape(l.sh_down, c_.dim, c_.shexp_ffn, p + "ffn_down_shexp")).empty()) return e;
                if (c_.shexp_gated && !(e = shape(l.sh_gate_inp, 1, c_.dim, p + "ffn_gate_inp_shexp")).empty()) return e;
            }
            if (c_.moe_mlp) {  // gemma4: the dense MLP beside, and its norms
                if (!(e = shape(l.wgate, ffn_of(i), c_.dim, p + "ffn_gate")).empty()) return e;
                if (!(e = shape(l.wup, ffn_of(i), c_.dim, p + "ffn_up")).empty()) return e;
                if (!(e = shape(l.wdown, c_.dim, ffn_of(i), p + "ffn_down")).empty()) return e;
                if (!l.ffn_post_norm_1 || !l.ffn_pre_norm_2 || !l.ffn_post_norm_2 || !l.router_in_scale)
                    return p + "post_ffw_norm_1/pre_ffw_norm_2/post_ffw_norm_2/ffn_gate_inp.scale missing";
            }
        } else {
            if (c_.ffn_ungated && l.wgate.present()) return p + "ffn_gate is set in a model whose FFNs have no gate";
            if (!c_.ffn_ungated && !(e = shape(l.wgate, ffn_of(i), c_.dim, p + "ffn_gate")).empty()) return e;
            if (!(e = shape(l.wup, ffn_of(i), c_.dim, p + "ffn_up")).empty()) return e;
            if (!(e = shape(l.wdown, c_.dim, ffn_of(i), p + "ffn_down")).empty()) return e;
        }
        if (c_.ple_dim > 0) {  // gemma4 E2B / E4B's per-layer embedding block
            if (!(e = shape(l.ple_gate, c_.ple_dim, c_.dim, p + "inp_gate")).empty()) return e;
            if (!(e = shape(l.ple_proj, c_.dim, c_.ple_dim, p + "proj")).empty()) return e;
            if (!l.ple_post_norm) return p + "post_norm is missing";
        }
        if (c_.altup > 0) {  // gemma3n: AltUp's router and coefficients, LAuReL
            if (!l.altup_router || !l.altup_router_norm || !l.altup_predict || !l.altup_correct ||
                !l.altup_correct_scale || !l.laurel_post_norm)
                return p + "altup_router / _norm / predict_coef / correct_coef / correct_scale or laurel_post_norm is missing";
            if (!l.laurel_l.present()) return p + "laurel_l is missing";
            if (!(e = shape(l.laurel_l, l.laurel_l.rows, c_.dim, p + "laurel_l")).empty()) return e;
            if (!(e = shape(l.laurel_r, c_.dim, l.laurel_l.rows, p + "laurel_r")).empty()) return e;
        }
    }
    return "";
}

// The cache lines of [p, p + bytes), fetched towards L1 all at once, before a serial loop writes
// (or reads) them one by one. The weights' stream through L2 and L3 evicts the engine's small
// buffers between two matmuls; a loop that then stores into them waits on one line after another
// (its stores drain in order), and the other threads idle meanwhile.
// (An asm, not __builtin_prefetch: GCC finds a function whose only effects are builtin prefetches
// free of side effects and drops its calls.)
static void prefetch_lines(const uint8_t *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) {
#if defined(__x86_64__)
        __asm__ volatile("prefetcht0 %0" : : "m"(p[o]));
#elif defined(__aarch64__)
        __asm__ volatile("prfm pstl1keep, %0" : : "Q"(p[o]));
#endif
    }
}

// x[T][m.n] in m's activation format: a quantized copy in act_ (reused when reuse_act and
// act_ already holds this input in that format), or x itself for float activations.
// *arb: bytes per token.
const uint8_t *Engine::quantize_input(const Mat &m, const float *x, int T, bool reuse_act, size_t *arb) {
    const Format &af = *format_by_id(format_by_id(m.type)->act);
    if (af.id == T_F32) {
        *arb = (size_t)m.n * sizeof(float);
        act_type_ = -1;  // act_ no longer holds this input: the next matmul must quantize it
        return reinterpret_cast<const uint8_t *>(x);
    }
    *arb = row_bytes(&af, m.n);
    if (!(reuse_act && act_type_ == af.id)) {
        if (act_.size() < *arb * T) act_.resize(*arb * T);
        prefetch_lines(act_.data(), *arb * T);
        const KernelEntry &qe = kernel_entry(af.id);
        for (int t = 0; t < T; ++t) qe.quant_act.fn(x + (size_t)t * m.n, act_.data() + (size_t)t * *arb, m.n);
        count_quant(af.id, qe.quant_act.isa, T, (int64_t)T * m.n);
        act_type_ = af.id;
    }
    return act_.data();
}

// y[T][m.rows] = x[T][m.n] . W^T: quantize x to the weight's activation format, run the
// row kernels (the dispatcher's choice), threaded over rows.
void Engine::record_act(const Mat &m, const float *x, int T, int mat, int n_mat, const int32_t *tok) {
    ActSums &a = acts_[m.src ? m.src : m.w];  // (the tensor as bound: lowbit.imatrix maps it to its name)
    if (a.sums.empty()) {
        a.n = m.n;
        a.sums.assign((size_t)n_mat * (size_t)m.n, 0.0);
        a.counts.assign((size_t)n_mat, 0);
    }
    double *acc = a.sums.data() + (size_t)mat * (size_t)m.n;
    for (int t = 0; t < T; ++t) {
        const float *xt = x + (size_t)(tok ? tok[t] : t) * (size_t)m.n;
        for (int64_t j = 0; j < m.n; ++j) acc[j] += (double)(xt[j] * xt[j]);
    }
    a.counts[(size_t)mat] += T;
}

void Engine::matmul(const Mat &m, const float *x, int T, float *out, bool reuse_act) {
    if (collect_ && T >= 16) record_act(m, x, T);
    const Format &f = *format_by_id(m.type);
    const KernelEntry &e = entry_of(m);
    size_t arb;
    const uint8_t *act = quantize_input(m, x, T, reuse_act, &arb);
    int threads = threads_ > 0 ? threads_ : ThreadPool::instance().size();
    run_rows(f, e, cpu_info().selected, m.w, m.stride, act, arb, T, out, (size_t)m.rows, m.n, m.scale, 0, m.rows,
             threads);
    if (m.out_scale != 1.0f)
        for (size_t i = 0; i < (size_t)T * m.rows; ++i) out[i] *= m.out_scale;
}

void Engine::matmuls(std::initializer_list<MatOut> mats, const float *x, int T) {
    std::vector<MatOut> todo;
    for (const MatOut &mo : mats)
        if (mo.m->present()) todo.push_back(mo);
    const int threads = threads_ > 0 ? threads_ : ThreadPool::instance().size();
    std::vector<RowJob> jobs;
    while (!todo.empty()) {  // one dispatch per activation format (and width), in order of first use
        const int act = format_by_id(todo[0].m->type)->act;
        const int64_t n = todo[0].m->n;
        std::vector<MatOut> group, rest;
        for (const MatOut &mo : todo)
            (format_by_id(mo.m->type)->act == act && mo.m->n == n ? group : rest).push_back(mo);
        if (collect_ && T >= 16)
            for (const MatOut &mo : group) record_act(*mo.m, x, T);  // (matmul's own hook)
        size_t arb;
        const uint8_t *a = quantize_input(*group[0].m, x, T, false, &arb);
        jobs.clear();
        for (const MatOut &mo : group) {
            const Format &f = *format_by_id(mo.m->type);
            jobs.push_back(RowJob{&f, &entry_of(*mo.m), mo.m->w, mo.m->stride, mo.m->scale, mo.out,
                                  (size_t)mo.m->rows, 0, mo.m->rows});
        }
        run_rows_multi(jobs.data(), (int)jobs.size(), cpu_info().selected, a, arb, T, n, threads);
        for (const MatOut &mo : group)
            if (mo.m->out_scale != 1.0f)
                for (size_t i = 0; i < (size_t)T * mo.m->rows; ++i) mo.out[i] *= mo.m->out_scale;
        todo.swap(rest);
    }
}

// out = x / sqrt(mean(x^2) + eps) * w, per token, rounded as ggml's rms_norm then mul: each
// square in float, summed in double, the mean and 1/sqrt in float, then (x * scale) * w.
// (Matching llama.cpp's rounding here keeps int8 activation roundings from flipping.)
// Each token's sum is one sequential chain of double adds (ggml's order), so a token's chain is
// latency-bound (~4 cycles an add); up to 8 tokens' chains run side by side in one loop (their
// sums in registers, each in its own order: bitwise the token-by-token loop, and 5-8x faster
// for a decode step's 8 tokens).
template <int N>
static void sum_squares(const float *x, int len, double *ss) {
    double s[N] = {};
    for (int i = 0; i < len; ++i)
        for (int t = 0; t < N; ++t) s[t] += (double)(x[(size_t)t * len + i] * x[(size_t)t * len + i]);
    for (int t = 0; t < N; ++t) ss[t] = s[t];
}

void Engine::rmsnorm(const float *x, const float *w, float *out, int T, int len) const {
    if (out != x) prefetch_lines((const uint8_t *)out, sizeof(float) * (size_t)T * len);
    double ss[8];
    for (int t0 = 0; t0 < T; t0 += 8) {
        const int n = T - t0 < 8 ? T - t0 : 8;
        const float *x0 = x + (size_t)t0 * len;
        switch (n) {
            case 1: sum_squares<1>(x0, len, ss); break;
            case 2: sum_squares<2>(x0, len, ss); break;
            case 3: sum_squares<3>(x0, len, ss); break;
            case 4: sum_squares<4>(x0, len, ss); break;
            case 5: sum_squares<5>(x0, len, ss); break;
            case 6: sum_squares<6>(x0, len, ss); break;
            case 7: sum_squares<7>(x0, len, ss); break;
            default: sum_squares<8>(x0, len, ss); break;
        }
        for (int u = 0; u < n; ++u) {
            const float *xt = x0 + (size_t)u * len;
            const float mean = (float)(ss[u] / len);
            const float s = 1.0f / std::sqrt(mean + c_.eps);
            float *o = out + (size_t)(t0 + u) * len;
            if (w) for (int i = 0; i < len; ++i) o[i] = xt[i] * s * w[i];
            else for (int i = 0; i < len; ++i) o[i] = xt[i] * s;  // (ggml_rms_norm alone)
        }
    }
}

// out = (x - mean) / sqrt(var + eps) * w per token, rounded as ggml_norm then mul: the sum in
// double, the mean in float; each centred square in float, summed in double, the variance and
// 1/sqrt in float; then ((x - mean) * scale) * w, then + b if there is one.
void Engine::layernorm(const float *x, const float *w, const float *b, float *out, int T, int len) const {
    for (int t = 0; t < T; ++t) {
        const float *xt = x + (size_t)t * len;
        float *o = out + (size_t)t * len;
        double sum = 0.0;
        for (int i = 0; i < len; ++i) sum += (double)xt[i];
        const float mean = (float)sum / (float)len;
        double ss = 0.0;
        for (int i = 0; i < len; ++i) {
            const float d = xt[i] - mean;
            o[i] = d;
            ss += (double)(d * d);
        }
        const float s = 1.0f / std::sqrt((float)(ss / len) + c_.eps);
        for (int i = 0; i < len; ++i) o[i] = o[i] * s * w[i];
        if (b) for (int i = 0; i < len; ++i) o[i] += b[i];
    }
}

// The rotation of each token of a forward call, computed once and shared by every layer's
// q and k: rot_[t * half + i] = (cos, sin) of pos[t] * rope_scale * inv_freq[i].
void Engine::rope_angles(int T, const int32_t *pos) {
    const int half = c_.rope_dims / 2;
    rot_.resize((size_t)T * half);
    if (!inv_freq_swa_.empty()) {  // gemma3's sliding layers: base rope_base_swa, no scaling
        const int hs = rope_dims_swa() / 2;
        rot_swa_.resize((size_t)T * hs);
        for (int t = 0; t < T; ++t)
            for (int i = 0; i < hs; ++i) {
                const double th = (double)pos[t] * inv_freq_swa_[i];
                rot_swa_[(size_t)t * hs + i] = {(float)std::cos(th), (float)std::sin(th)};
            }
    }
    const float ms = rope_mscale_;  // 1 but under YaRN or an attn_factor (then an exact no-op)
    for (int t = 0; t < T; ++t) {
        const double p = (double)pos[t] * rope_pos_scale_;
        for (int i = 0; i < half; ++i) {
            const double th = rope_zero_[(size_t)i] ? 0.0 : p * inv_freq_[i];
            rot_[(size_t)t * half + i] = {(float)std::cos(th) * ms, (float)std::sin(th) * ms};
        }
    }
    qtemp_.clear();
    if (c_.attn_temp_scale > 0.0f)  // llama.cpp's llm_graph_input_attn_temp, its types and order
        for (int t = 0; t < T; ++t) {
            const float p = (float)pos[t];
            qtemp_.push_back((float)(std::log(std::floor(p / (float)c_.attn_temp_floor) + 1.0) * c_.attn_temp_scale + 1.0));
        }
}

// Rotary embedding of the first `dims` of each head of v[T][heads][hd] with the angles of
// rope_angles (rot_ or rot_swa_, dims / 2 per token).
void Engine::rope(float *v, int T, int heads, int hd, int dims, const std::vector<std::pair<float, float>> &rot) const {
    const int half = dims / 2;
    // (heads outer, pairs inner: each head's dims are contiguous, and the neox pairs' loop
    // vectorises; every value gets the same two products and sum as in any order)
    for (int t = 0; t < T; ++t) {
        const std::pair<float, float> *r = rot.data() + (size_t)t * half;
        for (int h = 0; h < heads; ++h) {
            float *x = v + ((size_t)t * heads + h) * hd;
            if (c_.rope_neox) {
                for (int i = 0; i < half; ++i) {
                    const float cs = r[i].first, sn = r[i].second, x0 = x[i], x1 = x[i + half];
                    x[i] = x0 * cs - x1 * sn;
                    x[i + half] = x0 * sn + x1 * cs;
                }
            } else {
                for (int i = 0; i < half; ++i) {
                    const float cs = r[i].first, sn = r[i].second, x0 = x[2 * i], x1 = x[2 * i + 1];
                    x[2 * i] = x0 * cs - x1 * sn;
                    x[2 * i + 1] = x0 * sn + x1 * cs;
                }
            }
        }
    }
}

// Causal attention, GQA: query head h reads kv head h / (n_head / n_kv). Each (token, head)
// is computed on its own in a fixed order, so the result does not depend on T or threads.
// A float32 cache (kv_f16 = false) runs this plain loop; a half cache runs the dispatcher's
// attention kernel (scalar reference or a SIMD level).
static void attend_f32(const float *qv, const float *K, const float *V, int len, int hd, size_t kd, float scale,
                       float sink, float softcap, float *sc, float *o) {
    float mx = -INFINITY;
    for (int j = 0; j < len; ++j) {
        const float *kv = K + (size_t)j * kd;
        float s = 0.0f;
        for (int d = 0; d < hd; ++d) s += qv[d] * kv[d];
        sc[j] = s * scale;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    if (softcap > 0.0f) mx = ref::softcap_scores(sc, len, softcap);
    mx = sink > mx ? sink : mx;
    float sum = 0.0f;
    for (int j = 0; j < len; ++j) { sc[j] = std::exp(sc[j] - mx); sum += sc[j]; }
    if (sink > -INFINITY) sum += std::exp(sink - mx);
    const float inv = 1.0f / sum;
    for (int d = 0; d < hd; ++d) o[d] = 0.0f;
    for (int j = 0; j < len; ++j) {
        const float *vv = V + (size_t)j * kd;
        const float p = sc[j] * inv;
        for (int d = 0; d < hd; ++d) o[d] += p * vv[d];
    }
}

// ActOut on (the default) or off (LOWBIT_NO_ACT_OUT=1: the caller quantizes after the dispatch;
// the same bytes either way, a switch for A/B runs and for the test that says so)
static const bool kActOut = [] {
    const char *e = std::getenv("LOWBIT_NO_ACT_OUT");
    return !(e && *e && *e != '0');
}();

// An ActOut into act_next_ for m's input (T tokens of m.n values), if `ok` (nothing comes between
// the producer and m), ActOut is on, m's activation format is quantized block by block and its
// blocks divide `unit` (the values one thread makes whole: the GLU's rows, a head); else fn null.
ActOut Engine::act_out_begin(const Mat &m, int64_t unit, int T, bool ok) {
    const Format &af = *format_by_id(format_by_id(m.type)->act);
    if (!ok || !kActOut || !ActOut::blockwise(af.id) || unit % af.block != 0) return ActOut{};
    const size_t rb = row_bytes(&af, m.n);
    if (act_next_.size() < rb * T) act_next_.resize(rb * T);
    return ActOut{kernel_entry(af.id).quant_act.fn, af.block, (size_t)af.bytes, act_next_.data(), rb};
}

// After the producer's dispatch filled q: act_ holds m's input (the next matmul of m: reuse_act),
// counted as one quantization, as quantize_input would have.
void Engine::act_out_take(const ActOut &q, const Mat &m, int T) {
    if (!q.fn) return;
    const int af = format_by_id(m.type)->act;
    std::swap(act_, act_next_);
    act_type_ = af;
    count_quant(af, kernel_entry(af).quant_act.isa, T, (int64_t)T * m.n);
}

// The blocked attention of both caches (the shared-rows kernels: mla_f16_fn over the half cache,
// attn_q_rows_fn over a quantized one), per (block of tokens, kv head): a GQA group's heads share
// their key and value rows, and so do the tokens of a prompt chunk in one slot, so one kernel call
// takes up to `tb` tokens x `group` heads as its query rows and reads each cache row once for all
// of them (per head and token, the keys were the prefill's cost: 70% of a 4K-token prompt's time
// on the default model). Bitwise the per-head kernel (the kernels' contract: a row's result does
// not depend on the rows sharing its call), so logits do not change with the blocking, the chunk
// or the threads (I2, I3, I8).
// A block: consecutive tokens of one slot whose keys start at the same position (a sliding-window
// layer's tokens past the window each start elsewhere: blocks of one).
// kern(kvh, slot, first, qb, nrows, lens, sinks, sc, ob): the block's query rows qb[nrows][hd]
// (token-major, then the group's heads), row r seeing keys first .. first + lens[r] - 1 of the
// slot's kv head kvh, sinks[nrows] or null, scratch sc of nrows x maxlen floats; writes ob[nrows][hd].
template <class FirstKey, class Kern>
static void attention_blocks(const float *q, int T, const int32_t *slots, const int32_t *pos, float *out, int nh,
                             int n_kv, int hd, int maxlen, const float *attn_sinks, int threads,
                             const FirstKey &first_key, const Kern &kern, const ActOut *qo) {
    const int group = nh / n_kv;
    // tokens per block: up to 16 (measured: 4 / 8 / 16 gave 1.34 / 1.37 / 1.37x the per-token
    // calls' prefill, 2048 tokens, one thread), fewer when the scores (rows x keys floats) would
    // pass 1 MB (an L2's worth)
    const int tb = (int)std::max<int64_t>(1, std::min<int64_t>(16, ((int64_t)1 << 18) / ((int64_t)group * maxlen)));
    std::vector<int> blk;  // blk[b]: the block's first token; blk.back() == T
    int most = 1;          // tokens in the largest block
    for (int t = 0; t < T; ++t) {
        const bool joins = !blk.empty() && t - blk.back() < tb && slots[t] == slots[blk.back()] &&
                           first_key(t) == 0 && first_key(blk.back()) == 0;
        if (!joins) blk.push_back(t);
        most = std::max(most, t + 1 - blk.back());
    }
    const int64_t nblk = (int64_t)blk.size();
    blk.push_back(T);
    const int64_t gitems = nblk * n_kv;
    // A prompt's later blocks see more keys (a causal chunk's cost grows with the block): parts
    // are claimed in order, so part 0 takes the last items, and the cheapest come last, when one
    // thread may be idle waiting for the other's (longest-first). 8 per thread, as a GEMM's.
    const int64_t gparts = threads > 1 ? std::min<int64_t>(gitems, (int64_t)threads * 8) : 1;
    ThreadPool::instance().run((int)gparts, [&](int i, int nth) {
        int64_t b, e;
        split_range(gitems, nth - 1 - i, nth, &b, &e);
        // (per thread, kept across calls: a decode step's rows x keys are not zeroed anew)
        thread_local std::vector<float> sc, qb, ob, sk;
        thread_local std::vector<int32_t> lens;
        const size_t rows = (size_t)most * group;
        if (sc.size() < rows * maxlen) sc.resize(rows * maxlen);
        if (qb.size() < rows * hd) qb.resize(rows * hd), ob.resize(rows * hd);
        if (sk.size() < rows) sk.resize(rows), lens.resize(rows);
        for (int64_t it = b; it < e; ++it) {
            const int bi = (int)(it / n_kv), kvh = (int)(it % n_kv), h0 = kvh * group;
            const int t0 = blk[(size_t)bi], nt = blk[(size_t)bi + 1] - t0;
            const int first = first_key(t0);
            for (int u = 0; u < nt; ++u) {  // rows: token-major, then the group's heads
                std::memcpy(qb.data() + (size_t)u * group * hd, q + ((size_t)(t0 + u) * nh + h0) * hd,
                            sizeof(float) * group * hd);
                for (int g = 0; g < group; ++g) {
                    lens[(size_t)u * group + g] = pos[t0 + u] + 1 - first;
                    if (attn_sinks) sk[(size_t)u * group + g] = attn_sinks[h0 + g];
                }
            }
            kern(kvh, (int)slots[t0], first, qb.data(), nt * group, lens.data(), attn_sinks ? sk.data() : nullptr,
                 sc.data(), ob.data());
            for (int u = 0; u < nt; ++u) {
                float *o = out + ((size_t)(t0 + u) * nh + h0) * hd;
                std::memcpy(o, ob.data() + (size_t)u * group * hd, sizeof(float) * group * hd);
                if (qo) qo->put(o, t0 + u, (int64_t)h0 * hd, (int64_t)group * hd);
            }
        }
    });
}

// Token t attends to positions 0..pos[t] of its own slot slots[t] (a sliding-window layer: the
// last `window` of them), with the layer's attention sink for its head if it has sinks.
void Engine::attention(int layer, const float *q, int T, const int32_t *slots, const int32_t *pos, float *out,
                       const ActOut *qo) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int hd = hd_of(layer), nh = c_.n_head, n_kv = kv_of(layer), group = nh / n_kv;
    const KvLayer &g = kvl(layer);
    int maxlen = 0;
    for (int t = 0; t < T; ++t) maxlen = pos[t] + 1 > maxlen ? pos[t] + 1 : maxlen;
    // (gemma3: q was scaled by attn_scale already, and the softmax takes q.k as it is)
    const float scale = c_.attn_scale > 0.0f ? 1.0f : 1.0f / std::sqrt((float)hd);
    const float cap = c_.attn_softcap;  // gemma2: every score capped before the softmax (0: none)
    const int64_t items = (int64_t)T * nh;
    const int threads = threads_ > 0 ? threads_ : ThreadPool::instance().size();
    const attn_f16_fn attn16 = kernel_table().attn.fn;
    const attn_q_fn attnq = kernel_table().attnq.fn;
    const bool quant = kv_quant();
    const quant_act_fn q8 = kernel_entry(T_Q8_0).quant_act.fn;  // q as Q8_0 (ggml's from_float)
    // token t's first key: llama.cpp's standard sliding window masks key p0 when pos - p0 >= window
    auto first_key = [&](int t) { return L.window > 0 && pos[t] + 1 > L.window ? pos[t] + 1 - L.window : 0; };
    if (!quant && c_.kv_f16 && hd % 8 == 0 && (group > 1 || T > 1)) {
        const mla_f16_fn rows16 = kernel_table().mla.fn;
        attention_blocks(q, T, slots, pos, out, nh, n_kv, hd, maxlen, L.attn_sinks, threads, first_key,
                         [&](int kvh, int slot, int first, const float *qb, int nrows, const int32_t *lens,
                             const float *sinks, float *sc, float *ob) {
            rows16(qb, nrows, lens, k16_.data() + kv_k_at(slot, layer, first, kvh),
                   v16_.data() + kv_v_at(slot, layer, first, kvh), hd, hd, hd, scale, sinks, cap, sc, ob);
        }, qo);
        return;
    }
    if (quant && (group > 1 || T > 1)) {  // the same blocks over the quantized cache's head rows
        const attn_q_rows_fn rowsq = kernel_table().attnq_rows.fn;
        attention_blocks(q, T, slots, pos, out, nh, n_kv, hd, maxlen, L.attn_sinks, threads, first_key,
                         [&](int kvh, int slot, int first, const float *qb, int nrows, const int32_t *lens,
                             const float *sinks, float *sc, float *ob) {
            thread_local std::vector<block_q8_0> qq;  // the rows as Q8_0, as attn_q_fn takes them
            const int nb = hd / QK;
            if (qq.size() < (size_t)nrows * nb) qq.resize((size_t)nrows * nb);
            for (int r = 0; r < nrows; ++r)
                q8(qb + (size_t)r * hd, reinterpret_cast<uint8_t *>(qq.data() + (size_t)r * nb), hd);
            rowsq(reinterpret_cast<const uint8_t *>(qq.data()), nrows, lens, c_.kv_k,
                  kq_.data() + kv_k_at(slot, layer, first, kvh), g.krow, c_.kv_v,
                  vq_.data() + kv_v_at(slot, layer, first, kvh), g.vrow, hd, scale, sinks, cap, sc, ob);
        }, qo);
        return;
    }
    const int64_t parts = threads > 1 ? std::min<int64_t>(items, (int64_t)threads * 4) : 1;  // see run_rows
    ThreadPool::instance().run((int)parts, [&](int i, int nth) {
        int64_t b, e;
        split_range(items, i, nth, &b, &e);
        std::vector<float> sc((size_t)maxlen);
        block_q8_0 qq[512 / QK];
        for (int64_t it = b; it < e; ++it) {
            const int t = (int)(it / nh), h = (int)(it % nh), kvh = h / group;
            const float *qv = q + ((size_t)t * nh + h) * hd;
            float *o = out + ((size_t)t * nh + h) * hd;
            const int first = first_key(t);  // keys first..pos[t]
            const float sink = L.attn_sinks ? L.attn_sinks[h] : -INFINITY;
            const int len = pos[t] + 1 - first;
            const size_t ko = kv_k_at(slots[t], layer, first, kvh), vo = kv_v_at(slots[t], layer, first, kvh);
            if (quant) {  // (head rows krow / vrow bytes apart: head-major)
                q8(qv, reinterpret_cast<uint8_t *>(qq), hd);
                attnq(reinterpret_cast<const uint8_t *>(qq), c_.kv_k, kq_.data() + ko, g.krow, c_.kv_v,
                      vq_.data() + vo, g.vrow, len, hd, scale, sink, cap, sc.data(), o);
            } else if (c_.kv_f16) {  // (rows hd apart: head-major)
                attn16(qv, k16_.data() + ko, v16_.data() + vo, len, hd, hd, scale, sink, cap, sc.data(), o);
            } else {
                attend_f32(qv, k32_.data() + ko, v32_.data() + vo, len, hd, hd, scale, sink, cap, sc.data(), o);
            }
            if (qo) qo->put(o, t, (int64_t)h * hd, hd);
        }
    });
}

// x[rows][n] times the orthonormal Walsh-Hadamard matrix of order n (a power of 2), row by row,
// as ggml-cpu's fwht computes llama.cpp's mul_mat with GGML_HINT_SRC0_IS_HADAMARD: each value
// times 1 / sqrtf(n) first, then the butterflies (u + v, u - v) of spans 1, 2, 4 .. n / 2 in
// order; exact sums and differences in float, the same bits as ggml's whatever its SIMD width.
static void fwht_rows(float *x, size_t rows, int n) {
    const float scale = 1.0f / std::sqrt((float)n);
    for (size_t r = 0; r < rows; ++r) {
        float *y = x + r * n;
        for (int j = 0; j < n; ++j) y[j] = y[j] * scale;
        for (int len = 1; len < n; len <<= 1)
            for (int i = 0; i < n; i += 2 * len)
                for (int j = 0; j < len; ++j) {
                    const float u = y[i + j], v = y[i + len + j];
                    y[i + j] = u + v;
                    y[i + len + j] = u - v;
                }
    }
}

static void head_norm(float *v, const float *w, int T, int heads, int hd, float eps) {
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h) {
            float *x = v + ((size_t)t * heads + h) * hd;
            double ss = 0.0;
            for (int d = 0; d < hd; ++d) ss += (double)x[d] * x[d];
            const float s = (float)(1.0 / std::sqrt(ss / hd + eps));
            if (w) for (int d = 0; d < hd; ++d) x[d] = x[d] * s * w[d];
            else for (int d = 0; d < hd; ++d) x[d] = x[d] * s;  // (ggml_rms_norm alone)
        }
}

// Gemma 3n's activation sparsity on g[T][n] in place, as llama.cpp's gaussian_topk: per row,
// mean = sum / n, std = sqrt(sum((g - mean)^2) / (n - 1)) (sums in double, rounded to float),
// g = relu(g - (mean + std * mul)).
static void gaussian_topk(float *g, int T, int n, float mul) {
    for (int t = 0; t < T; ++t) {
        float *x = g + (size_t)t * n;
        double s = 0.0;
        for (int i = 0; i < n; ++i) s += (double)x[i];
        const float mean = (float)s / (float)n;
        double v = 0.0;
        for (int i = 0; i < n; ++i) { const float d = x[i] - mean; v += (double)(d * d); }
        const float sd = std::sqrt((float)v * (1.0f / (float)(n - 1)));
        const float cut = mean + sd * mul;
        for (int i = 0; i < n; ++i) { const float d = x[i] - cut; x[i] = d > 0.0f ? d : 0.0f; }
    }
}

static void add_bias(float *v, const float *b, int T, int len) {
    if (!b) return;
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < len; ++i) v[(size_t)t * len + i] += b[i];
}

// Gated FFN on T tokens: out = down(act(gate(x)) * up(x)), act = SiLU (SwiGLU) or ReLU^2
// (c_.ffn_act); out may alias x. Gate and up run fused with the GLU epilogue (run_rows_glu:
// one pool dispatch, x quantized once) when they pair with the same activation format,
// else as two matmuls and the epilogue over the whole array (the same values either way).
void Engine::dense_ffn(const Mat &gate, const Mat &up, const Mat &down, const float *x, int T, float *out,
                       const float *sub_norm, const float *up_b, const float *down_b, bool sparse) {
    if (!gate.present()) {  // an ungated MLP: down(act(up . x + up_b)) + down_b (nemotron_h: relu^2 or
        // silu, ggml's relu then sqr; starcoder2 / phi2: ggml_gelu, biases)
        const size_t n = (size_t)T * up.rows;
        if (g_.size() < n) g_.resize(n);
        matmul(up, x, T, g_.data());
        add_bias(g_.data(), up_b, T, (int)up.rows);
        if (c_.ffn_act == FFN_RELU2) {
            for (size_t i = 0; i < n; ++i) { const float r = g_[i] > 0.0f ? g_[i] : 0.0f; g_[i] = r * r; }
        } else if (c_.ffn_act == FFN_GELU) {  // ggml_vec_gelu_f32 is GeGLU's epilogue with up = 1, bit for bit
            if (ones_.size() < n) ones_.assign(n, 1.0f);
            kernel_table().glu.fn(g_.data(), ones_.data(), g_.data(), (int64_t)n, GLU_GEGLU);
        } else {
            for (size_t i = 0; i < n; ++i) g_[i] = silu_f32(g_[i]);
        }
        matmul(down, g_.data(), T, out);
        add_bias(out, down_b, T, (int)down.rows);
        return;
    }
    const size_t n = (size_t)T * gate.rows;
    if (g_.size() < n) g_.resize(n);
    const Format &fg = *format_by_id(gate.type), &fu = *format_by_id(up.type);
    const GluKernel &glu = kernel_table().glu;
    const int kind = glu_kind(c_.ffn_act);
    const glu_fn epilogue = kind == GLU_SWIGLU_OAI ? ref::glu : glu.fn;  // (OAI: the reference only)
    const int isa = cpu_info().selected;
    // (the fused path takes SiLU, ReLU^2 and GeGLU; gpt-oss's clamped SwiGLU runs the two
    // matmuls, then the reference epilogue)
    bool pre = false;  // down's input already quantized (ActOut)
    if (fg.act == fu.act && kind != GLU_SWIGLU_OAI && !sparse) {
        if (collect_ && T >= 16) { record_act(gate, x, T); record_act(up, x, T); }  // (matmul's own hook)
        size_t arb;
        const uint8_t *act = quantize_input(gate, x, T, false, &arb);
        const RowMat G{&fg, &entry_of(gate), gate.w, gate.stride, gate.scale, gate.out_scale};
        const RowMat U{&fu, &entry_of(up), up.w, up.stride, up.scale, up.out_scale};
        const int threads = threads_ > 0 ? threads_ : ThreadPool::instance().size();
        // down's input quantized by the dispatch that makes it (ActOut), unless a norm comes between
        const ActOut q = act_out_begin(down, gate.rows, T, !sub_norm && down.n == gate.rows);
        run_rows_glu(G, U, glu, kind, isa, act, arb, T, g_.data(), (size_t)gate.rows, gate.n, gate.rows, threads,
                     q.fn ? &q : nullptr);
        act_out_take(q, down, T);
        pre = q.fn != nullptr;
    } else {
        if (u_.size() < n) u_.resize(n);
        matmul(gate, x, T, g_.data());
        matmul(up, x, T, u_.data(), true);
        if (sparse) gaussian_topk(g_.data(), T, (int)gate.rows, c_.sparse_std_mul);
        count_glu(kind, glu.isa, gate.rows, (int64_t)n);
        epilogue(g_.data(), u_.data(), g_.data(), (int64_t)n, kind);
    }
    if (sub_norm) rmsnorm(g_.data(), sub_norm, g_.data(), T, (int)gate.rows);  // bitnet: before ffn_down
    matmul(down, g_.data(), T, out, pre);
}

void Engine::forward(const int32_t *tokens, int T, int pos, float *logits, bool all_logits) {
    if (T < 1) throw std::invalid_argument("forward: need at least one token");
    if (pos < 0 || pos + T > c_.n_ctx)
        throw std::invalid_argument("forward: positions " + std::to_string(pos) + ".." + std::to_string(pos + T - 1) +
                                    " exceed the context of " + std::to_string(c_.n_ctx));
    std::vector<int32_t> slots((size_t)T, 0), ps((size_t)T), rows;
    for (int t = 0; t < T; ++t) ps[(size_t)t] = pos + t;
    for (int t = all_logits ? 0 : T - 1; t < T; ++t) rows.push_back(t);
    forward_batch(tokens, slots.data(), ps.data(), T, rows.data(), (int)rows.size(), logits);
}

void Engine::set_prefetch(int mode) {
    if (mode != kPrefetchOff && mode != kPrefetchL1 && mode != kPrefetchMeasure)
        throw std::invalid_argument("set_prefetch: 0 off, 1 l1 or 2 measure");
    trials_.clear();
    measure_left_ = mode == kPrefetchMeasure ? kMeasureSkip + 2 * kMeasureEach : 0;
    prefetch_ = mode == kPrefetchMeasure ? kPrefetchL1 : mode;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void Engine::forward_batch(const int32_t *tokens, const int32_t *slots, const int32_t *pos, int T,
                           const int32_t *out_rows, int n_out, float *logits) {
    if (c_.layer_begin != 0 || c_.layer_end != c_.n_layer)
        throw std::invalid_argument("forward: this engine is a pipeline stage (layers " + std::to_string(c_.layer_begin) +
                                    ".." + std::to_string(c_.layer_end - 1) + "): use forward_layers");
    forward_layers(tokens, slots, pos, T, nullptr, nullptr, out_rows, n_out, logits);
}

void Engine::forward_layers(const int32_t *tokens, const int32_t *slots, const int32_t *pos, int T, const float *x_in,
                            float *x_out, const int32_t *out_rows, int n_out, float *logits) {
    // set_prefetch(kPrefetchMeasure): the skipped forwards (a process's first ones fault pages in)
    // run l1; the measured ones alternate off, l1, off, ...
    const int left = T == 1 ? measure_left_ : 0, k = 2 * kMeasureEach - left;  // k: this trial's index
    if (left > 0 && k >= 0) prefetch_ = k % 2 == 0 ? kPrefetchOff : kPrefetchL1;
    const auto t0 = now();
    layers_pass(tokens, slots, pos, T, x_in, x_out, out_rows, n_out, logits);
    if (left <= 0) return;
    if (k >= 0) trials_.emplace_back(prefetch_, seconds(t0, now()));
    if (--measure_left_ > 0) return;
    const auto [off, l1] = prefetch_medians();
    prefetch_ = off < l1 ? kPrefetchOff : kPrefetchL1;
}

std::pair<double, double> Engine::prefetch_medians() const {
    std::vector<double> off, l1;
    for (const auto &[m, s] : trials_) (m == kPrefetchOff ? off : l1).push_back(s);
    if (off.empty() || l1.empty()) return {0.0, 0.0};
    return {median(off), median(l1)};
}

void Engine::layers_pass(const int32_t *tokens, const int32_t *slots, const int32_t *pos, int T, const float *x_in,
                         float *x_out, const int32_t *out_rows, int n_out, float *logits) {
    const bool first = c_.layer_begin == 0, last = c_.layer_end == c_.n_layer;
    if (T < 1) throw std::invalid_argument("forward: need at least one token");
    if (first == (x_in != nullptr) || (!last && !x_out))
        throw std::invalid_argument("forward_layers: the first stage takes tokens, a later one the residual stream "
                                    "(x_in); a stage before the last returns it (x_out)");
    if (!last) n_out = 0;  // (the head runs in the last stage only)
    for (int t = 0; t < T; ++t) {
        if (first && (tokens[t] < 0 || tokens[t] >= c_.vocab))
            throw std::invalid_argument("forward: token id " + std::to_string(tokens[t]) + " outside the vocabulary");
        if (slots[t] < 0 || slots[t] >= c_.n_slots)
            throw std::invalid_argument("forward: slot " + std::to_string(slots[t]) + " outside 0.." +
                                        std::to_string(c_.n_slots - 1));
        if (pos[t] < 0 || pos[t] >= c_.n_ctx)
            throw std::invalid_argument("forward: position " + std::to_string(pos[t]) + " exceeds the context of " +
                                        std::to_string(c_.n_ctx));
        for (int u = 0; u < t; ++u)  // T is a batch (tens of tokens): quadratic is fine
            if (slots[u] == slots[t] && pos[u] == pos[t])
                throw std::invalid_argument("forward: two tokens at position " + std::to_string(pos[t]) +
                                            " of slot " + std::to_string(slots[t]));
    }
    if (n_out < 0) throw std::invalid_argument("forward: negative output count");
    for (int t = 0; t < T; ++t) use_slot(slots[t]);
    for (int i = 0; i < n_out; ++i)
        if (out_rows[i] < 0 || out_rows[i] >= T)
            throw std::invalid_argument("forward: output row " + std::to_string(out_rows[i]) + " outside the batch");
    // Hybrid models: each slot's tokens must continue its recurrent state (at rpos_) or restart
    // it at position 0, in order; checked before anything is written.
    std::vector<int32_t> next_pos;
    if (hybrid()) {
        next_pos.assign((size_t)c_.n_slots, -1);  // -1: slot not seen yet in this batch
        for (int t = 0; t < T; ++t) {
            const size_t s = (size_t)slots[t];
            const int want = next_pos[s] >= 0 ? next_pos[s] : (pos[t] == 0 ? 0 : rpos_[s]);
            if (pos[t] != want)
                throw std::invalid_argument("forward: slot " + std::to_string(slots[t]) + "'s recurrent state is at position " +
                                            std::to_string(want) + ", not " + std::to_string(pos[t]) +
                                            " (a hybrid model's slot continues in order, or restarts at 0)");
            next_pos[s] = pos[t] + 1;
        }
        for (int s = 0; s < c_.n_slots; ++s)
            if (next_pos[(size_t)s] >= 0) {
                int first = -1;
                for (int t = 0; t < T && first < 0; ++t) if (slots[t] == s) first = pos[t];
                if (first == 0) rstate_clear(s);
                // the replay log: this call's tokens if 2..kReplayMax (deltanet fills it), else
                // what the log held before the first position this call writes
                // (a call that logs: none until it has finished, below)
                const int n = next_pos[(size_t)s] - first;
                tlog_cut(s, n >= 2 && n <= kReplayMax ? -1 : first);
            }
    }
    const int dim = c_.dim, ffn = c_.ffn;
    x_.resize((size_t)T * dim); h_.resize((size_t)T * dim); q_.resize((size_t)T * qd_max_);
    k_.resize((size_t)T * kd_max_); v_.resize((size_t)T * kd_max_); att_.resize((size_t)T * qd_max_);
    g_.resize((size_t)T * ffn);  // (u_: only the unfused dense_ffn fallback)

    if (first) {
        const dequant_fn deq = kernel_entry(embd_.type).dequant;
        for (int t = 0; t < T; ++t) deq(embd_.w + (size_t)tokens[t] * embd_.stride, x_.data() + (size_t)t * dim, dim, embd_.scale);
        if (c_.embd_scale > 0.0f)  // gemma: ggml_scale(inp, sqrtf(n_embd))
            for (size_t i = 0; i < (size_t)T * dim; ++i) x_[i] *= c_.embd_scale;
        if (c_.ple_dim > 0) ple_inputs(tokens, T);  // gemma4 E2B / E4B, gemma3n
        if (c_.altup > 0) altup_init(T);  // gemma3n
    } else {
        std::memcpy(x_.data(), x_in, sizeof(float) * (size_t)T * dim);
    }

    g_prefetch_mode = prefetch_;  // (this model's: set_prefetch)
    rope_angles(T, pos);
    for (int l = c_.layer_begin; l < c_.layer_end; ++l) {
        const LayerWeights &L = layers_[(size_t)l];
        const auto t0 = now();
        if (c_.altup > 0) altup_predict(l, T);  // gemma3n: x_ = the active stream's prediction
        if (c_.parallel_ffn) {  // command-r: attention and the FFN on one norm's output; x + FFN + attention
            pre_norm(L.attn_norm, L.attn_norm_b, T);
            fin_.assign(h_.begin(), h_.begin() + (ptrdiff_t)T * dim);
            mixer_block(l, T, slots, pos);
            ffn_block(l, fin_.data(), T, fin_.data());
            residual(fin_.data(), T);
            residual(h_.data(), T);
            if (stats_on_) stats_[(size_t)l].t_attn += seconds(t0, now());  // (both blocks)
        } else if (L.has_mixer) {  // (nemotron_h: an FFN-only layer has none)
            pre_norm(L.attn_norm, L.attn_norm_b, T);
            const bool lr = L.laurel_l.present();  // gemma3n: LAuReL beside the attention
            if (lr) laurel(l, T);
            mixer_block(l, T, slots, pos);
            residual(h_.data(), T);
            if (lr) {
                const float s = 1.0f / std::sqrt(2.0f);
                for (size_t i = 0; i < (size_t)T * dim; ++i) x_[i] = (x_[i] + lau_[i]) * s;
            }
        }
        const auto t1 = now();
        if (L.has_ffn && !c_.parallel_ffn) {  // (nemotron_h: a mixer-only layer has none)
            pre_norm(L.ffn_norm, L.ffn_norm_b, T);
            const bool moe = moe_layer(l);
            float *out = moe ? (mo_.resize((size_t)T * dim), mo_.data()) : h_.data();
            ffn_block(l, h_.data(), T, out);
            residual(out, T);
            if (stats_on_ && !moe) {
                LayerStats &s = stats_[(size_t)l];
                s.t_ffn += seconds(t1, now());
                s.weight_bytes += mat_bytes(L.wgate) + mat_bytes(L.wup) + mat_bytes(L.wdown);
            }
        }
        if (c_.altup > 0) altup_correct(l, T);  // gemma3n (with its per-layer embedding block)
        else if (c_.ple_dim > 0) ple_block(l, T);  // gemma4 E2B / E4B
        if (L.out_scale)  // gemma4: ggml_mul(cur, layer_output_scale), a [1] broadcast
            for (size_t i = 0; i < (size_t)T * dim; ++i) x_[i] *= L.out_scale[0];
        if (stats_on_) {
            LayerStats &s = stats_[(size_t)l];
            s.calls += 1;
            s.tokens += T;
            s.t_attn += seconds(t0, t1);
            s.weight_bytes += mat_bytes(L.wq) + mat_bytes(L.wk) + mat_bytes(L.wv) + mat_bytes(L.wo) +
                              mat_bytes(L.wqkv) + mat_bytes(L.wqkv_gate) + mat_bytes(L.ssm_alpha) +
                              mat_bytes(L.ssm_beta) + mat_bytes(L.ssm_ba) + mat_bytes(L.ssm_out) +
                              mat_bytes(L.sc_in) + mat_bytes(L.sc_out) + mat_bytes(L.ssm_in) +
                              mat_bytes(L.ple_gate) + mat_bytes(L.ple_proj) + mat_bytes(L.laurel_l) + mat_bytes(L.laurel_r);
        }
    }
    if (hybrid())
        for (int s = 0; s < c_.n_slots; ++s)
            if (next_pos[(size_t)s] >= 0) {
                const int n = next_pos[(size_t)s] - rpos_[(size_t)s];  // (pos 0 restarts: rpos_ was cleared)
                if (n >= 2 && n <= kReplayMax) tlog_p0_[(size_t)s] = rpos_[(size_t)s], tlog_n_[(size_t)s] = n;
                rpos_[(size_t)s] = next_pos[(size_t)s];
            }
    if (c_.altup > 0) altup_merge(T);  // gemma3n: the streams back to one
    if (!last) { std::memcpy(x_out, x_.data(), sizeof(float) * (size_t)T * dim); return; }
    if (n_out == 0) return;
    for (int i = 0; i < n_out; ++i)  // the output rows, packed (rows of h_ are free now), then their final norm
        std::memcpy(h_.data() + (size_t)i * dim, x_.data() + (size_t)out_rows[i] * dim, sizeof(float) * (size_t)dim);
    norm(h_.data(), out_norm_, out_norm_b_, h_.data(), n_out, dim);
    matmul(output_, h_.data(), n_out, logits);
    if (c_.logit_scale > 0.0f) {  // granite: ggml_scale(logits, 1.0f / f_logit_scale)
        const float s = 1.0f / c_.logit_scale;
        for (size_t i = 0; i < (size_t)n_out * c_.vocab; ++i) logits[i] *= s;
    }
    if (out_b_)  // phi2: ggml_add(logits, output_b)
        for (int i = 0; i < n_out; ++i)
            for (int j = 0; j < c_.vocab; ++j) logits[(size_t)i * c_.vocab + j] += out_b_[j];
    if (c_.logit_mult > 0.0f)  // command-r / cohere2: ggml_scale(logits, f_logit_scale)
        for (size_t i = 0; i < (size_t)n_out * c_.vocab; ++i) logits[i] *= c_.logit_mult;
    if (c_.logit_softcap > 0.0f) {  // gemma 2 style: scale by 1/cap, tanh, scale by cap (as ggml)
        const float inv = 1.0f / c_.logit_softcap, cap = c_.logit_softcap;
        for (size_t i = 0; i < (size_t)n_out * c_.vocab; ++i) logits[i] = std::tanh(logits[i] * inv) * cap;
    }
}

// The mixer block of layer l: its output [T][dim] into h_ from the normed input in h_. A hybrid
// model's recurrent layer runs its delta-net, LFM2's short conv or a Mamba mixer (Falcon-H1's
// Mamba-2 runs beside the attention, in attention_block); DeepSeek's layers their latent
// attention (csrc/mla.cpp); every other layer attention_block.
void Engine::mixer_block(int l, int T, const int32_t *slots, const int32_t *pos) {
    float *h = h_.data();
    if (layers_[(size_t)l].recurrent && !c_.ssm_parallel) {
        if (c_.shortconv) shortconv(l, h, T, slots, h);
        else if (c_.mamba2) mamba2(l, h, T, slots, h);
        else if (c_.mamba1) mamba1(l, h, T, slots, h);
        else deltanet(l, h, T, slots, h);
    } else if (mla()) {
        mla_attention(l, h, T, slots, pos, h);
    } else {
        attention_block(l, T, slots, pos);
    }
}

// The cache lines this call's tokens' K and V rows go to, fetched for writing while the q / k /
// v matmuls run. Each step writes new positions, whose lines the weight stream has pushed out of
// the caches (or never held): stored one by one after the matmuls they stall the caller on DRAM,
// the other threads idle (a 16-token step of the default model on Zen 4: ~7% of it).
void Engine::prefetch_kv_rows(int l, int T, const int32_t *slots, const int32_t *pos) {
    const KvLayer &g = kvl(l);
    const size_t el = kv_el();
    const uint8_t *k = kv_base(false), *v = kv_base(true);
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < g.heads; ++h) {
            prefetch_lines(k + kv_k_at(slots[t], l, pos[t], h) * el, g.krow * el);
            prefetch_lines(v + kv_v_at(slots[t], l, pos[t], h) * el, g.vrow * el);
        }
}

// The attention block of layer l (every family but MLA's): its output [T][dim] into h_, from the
// normed input in h_ (q / k / v projections, biases, q / k norms, rope, the cache write, the
// attention, the output projection and its post-norm); the caller adds the residual.
void Engine::attention_block(int l, int T, const int32_t *slots, const int32_t *pos) {
    const LayerWeights &L = layers_[(size_t)l];
    const int dim = c_.dim;
    const int hd = hd_of(l), n_kv = kv_of(l), qd = c_.n_head * hd, kd = n_kv * hd;
    if (c_.ssm_parallel) {  // falcon-h1: the Mamba-2 mixer beside the attention, on the same input
        par_.resize((size_t)T * dim);
        mamba2(l, h_.data(), T, slots, par_.data());
    }
    const bool shared = kv_shared(l);  // gemma4: k and v are an earlier layer's (its cache rows)
    if (!shared) prefetch_kv_rows(l, T, slots, pos);
    if (c_.attn_gate) {  // attn_q: [q_h, gate_h] per head, split into q_ and agate_
        qg_.resize((size_t)T * 2 * qd);
        agate_.resize((size_t)T * qd);
        matmuls({{&L.wq, qg_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}}, h_.data(), T);
        for (int t = 0; t < T; ++t)
            for (int hh = 0; hh < c_.n_head; ++hh) {
                const float *src = qg_.data() + ((size_t)t * c_.n_head + hh) * 2 * hd;
                std::memcpy(q_.data() + ((size_t)t * c_.n_head + hh) * hd, src, sizeof(float) * hd);
                std::memcpy(agate_.data() + ((size_t)t * c_.n_head + hh) * hd, src + hd, sizeof(float) * hd);
            }
    } else {  // q, k, v: one dispatch, one quantized copy of h
        matmuls({{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}}, h_.data(), T);
    }
    if (!L.wv.present() && !shared) std::memcpy(v_.data(), k_.data(), sizeof(float) * (size_t)T * kd);  // gemma4: v = k's projection
    add_bias(q_.data(), L.bq, T, qd);
    add_bias(k_.data(), L.bk, T, kd);
    add_bias(v_.data(), L.bv, T, kd);
    if (c_.qk_norm_full) {  // olmoe: one RMSNorm over each token's whole q / k vector
        if (L.q_norm) head_norm(q_.data(), L.q_norm, T, 1, qd, c_.eps);
        if (L.k_norm) head_norm(k_.data(), L.k_norm, T, 1, kd, c_.eps);
    } else {
        if (c_.layer_norm && L.q_norm) {  // Command R+: a LayerNorm per head, each head its own weight row (set_vec)
            for (int t = 0; t < T; ++t)
                for (int hh = 0; hh < c_.n_head; ++hh) {
                    float *qh = q_.data() + ((size_t)t * c_.n_head + hh) * hd;
                    layernorm(qh, L.q_norm + (size_t)hh * hd, nullptr, qh, 1, hd);
                }
            for (int t = 0; t < T && !shared; ++t)
                for (int hh = 0; hh < n_kv; ++hh) {
                    float *kh = k_.data() + ((size_t)t * n_kv + hh) * hd;
                    layernorm(kh, L.k_norm + (size_t)hh * hd, nullptr, kh, 1, hd);
                }
        } else {
            if (L.q_norm) head_norm(q_.data(), L.q_norm, T, c_.n_head, hd, c_.eps);
            if (L.k_norm && !shared) head_norm(k_.data(), L.k_norm, T, n_kv, hd, c_.eps);
        }
    }
    if (c_.v_norm && !shared) head_norm(v_.data(), nullptr, T, n_kv, hd, c_.eps);  // gemma4: ggml_rms_norm(Vcur)
    if (L.rope) {
        const bool swa = L.window > 0 && !inv_freq_swa_.empty();
        const int dims = swa ? rope_dims_swa() : c_.rope_dims;
        rope(q_.data(), T, c_.n_head, hd, dims, swa ? rot_swa_ : rot_);
        if (!shared) rope(k_.data(), T, n_kv, hd, dims, swa ? rot_swa_ : rot_);
    }
    if (!qtemp_.empty())  // mistral3: ggml_mul(Qcur, inp_attn_scale) after rope
        for (int t = 0; t < T; ++t)
            for (size_t i = 0; i < (size_t)qd; ++i) q_[(size_t)t * qd + i] *= qtemp_[(size_t)t];
    if (c_.attn_scale > 0.0f)  // gemma3: ggml_scale(Qcur, f_attention_scale) after rope
        for (size_t i = 0; i < (size_t)T * qd; ++i) q_[i] *= c_.attn_scale;
    const int rk = rot_k(hd), rv = rot_v(hd);
    if (rk) {  // a quantized cache: llama.cpp's rotations (rot_k / rot_v in engine.h)
        fwht_rows(q_.data(), (size_t)T * qd / rk, rk);
        if (!shared) fwht_rows(k_.data(), (size_t)T * kd / rk, rk);
    }
    if (rv && !shared) fwht_rows(v_.data(), (size_t)T * kd / rv, rv);
    for (int t = 0; t < T && !shared; ++t) {  // each token's k, v into its slot at its position
        const size_t src = (size_t)t * kd;
        for (int h = 0; h < n_kv; ++h) {  // (head-major: kv_k_at, kv_v_at)
            const size_t s = src + (size_t)h * hd;
            const size_t ka = kv_k_at(slots[t], l, pos[t], h), va = kv_v_at(slots[t], l, pos[t], h);
            if (kv_quant()) {  // as llama.cpp's set_rows writes its cache: from_float, block by block
                kv_store_row(c_.kv_k, k_.data() + s, hd, kq_.data() + ka);
                kv_store_row(c_.kv_v, v_.data() + s, hd, vq_.data() + va);
                continue;
            }
            if (c_.kv_f16) {
                f32_to_fp16_row(k_.data() + s, k16_.data() + ka, hd);
                f32_to_fp16_row(v_.data() + s, v16_.data() + va, hd);
            } else {
                std::memcpy(k32_.data() + ka, k_.data() + s, sizeof(float) * hd);
                std::memcpy(v32_.data() + va, v_.data() + s, sizeof(float) * hd);
            }
        }
    }
    // wo's input quantized by the attention's threads (ActOut, a head's values whole blocks) when
    // nothing comes between
    const ActOut qo = act_out_begin(L.wo, hd, T, !rv && !c_.attn_gate && !L.attn_sub_norm && L.wo.n == qd);
    const auto ta = now();
    attention(l, q_.data(), T, slots, pos, att_.data(), qo.fn ? &qo : nullptr);
    if (stats_on_) stats_[(size_t)l].t_attn_core += seconds(ta, now());
    act_out_take(qo, L.wo, T);
    if (rv) fwht_rows(att_.data(), (size_t)T * qd / rv, rv);  // undo v's rotation
    if (c_.attn_gate)  // ggml_sigmoid: 1 / (1 + exp(-x))
        for (size_t i = 0; i < (size_t)T * qd; ++i) att_[i] *= 1.0f / (1.0f + std::exp(-agate_[i]));
    if (L.attn_sub_norm) rmsnorm(att_.data(), L.attn_sub_norm, att_.data(), T, qd);  // bitnet: before wo
    matmul(L.wo, att_.data(), T, h_.data(), qo.fn != nullptr);
    add_bias(h_.data(), L.bo, T, dim);
    if (L.attn_post_norm) rmsnorm(h_.data(), L.attn_post_norm, h_.data(), T, dim);  // gemma3
    if (c_.ssm_parallel)  // falcon-h1: attn_out + ssm_out, then the residual
        for (size_t i = 0; i < (size_t)T * dim; ++i) h_[i] += par_[i];
}

// The FFN block of layer l: out[T][dim] (may alias x) from its normed input x[T][dim]: a dense
// gated FFN, the experts (Gemma 4: its MLP beside them, reading h_ and x_), then the post-norm if
// any; the caller adds the residual.
void Engine::ffn_block(int l, const float *x, int T, float *out) {
    const LayerWeights &L = layers_[(size_t)l];
    if (moe_layer(l)) {
        if (c_.moe_mlp) moe_beside_mlp(l, T, out);  // gemma4
        else moe_ffn(l, x, T, out);
    } else {  // (a dense model, or one of glm4moe's leading dense layers)
        dense_ffn(L.wgate, L.wup, L.wdown, x, T, out, L.ffn_sub_norm, L.ffn_up_b, L.ffn_down_b, l < c_.sparse_layers);
    }
    if (L.ffn_post_norm) rmsnorm(out, L.ffn_post_norm, out, T, c_.dim);  // gemma3
}

void Engine::hidden(const int32_t *rows, int n, float *out) const {
    if (c_.layer_end != c_.n_layer || !out_norm_)
        throw std::invalid_argument("hidden: only the last stage has the output norm");
    const int64_t T = (int64_t)(x_.size() / (size_t)c_.dim);
    for (int i = 0; i < n; ++i)
        if (rows[i] < 0 || rows[i] >= T)
            throw std::invalid_argument("hidden: row " + std::to_string(rows[i]) + " outside the last call's " +
                                        std::to_string(T) + " tokens");
    for (int i = 0; i < n; ++i)
        norm(x_.data() + (size_t)rows[i] * c_.dim, out_norm_, out_norm_b_, out + (size_t)i * c_.dim, 1, c_.dim);
}

size_t Engine::kv_bytes(int n) const {
    const size_t el = kv_el();
    size_t b = 0;
    for (const KvLayer &g : kvl_) b += (size_t)g.heads * n * (g.krow + g.vrow) * el;
    return b;
}

// One position's K or V row (n_kv * head_dim floats) into the cache in `type`: Q8_0 by ggml's
// from_float (the level's activation quantizer, byte-identical to it), Q4_0 by
// quantize_row_q4_0_ref (ggml's CPU from_float for Q4_0), half by rounding to nearest even.
void kv_store_row(int type, const float *x, int64_t n, uint8_t *dst) {
    if (type == T_Q8_0) kernel_entry(T_Q8_0).quant_act.fn(x, dst, n);
    else if (type == T_Q4_0) quant::row_q4_0(x, dst, n, nullptr);
    else f32_to_fp16_row(x, reinterpret_cast<uint16_t *>(dst), n);  // (the cache's rows are 2-byte aligned)
}

void Engine::kv_copy(int slot, int p0, int n, uint8_t *buf, bool save) {
    if (slot < 0 || slot >= c_.n_slots || p0 < 0 || n < 0 || p0 + n > c_.n_ctx)
        throw std::invalid_argument("kv_copy: positions " + std::to_string(p0) + "+" + std::to_string(n) +
                                    " of slot " + std::to_string(slot) + " outside the cache");
    // Hybrid models: the KV of a prefix is not all of its state. Loading it leaves the slot's
    // recurrent state unknown (position -1): a forward is refused until rstate_copy loads the
    // state that goes with it (or the slot restarts at 0), never silently half restored.
    if (!save) use_slot(slot);
    if (hybrid() && !save) {
        rpos_[(size_t)slot] = -1;
        tlog_cut(slot, p0);  // the replay log keeps only what precedes the positions loaded
    }
    // [layer][K: kv heads][V: kv heads][n][head row], each head's n rows one contiguous run, as
    // they lie in the cache (a quantized one's blocks as they are)
    const size_t el = kv_el();
    uint8_t *k = kv_base(false), *v = kv_base(true);
    uint8_t *bl = buf;
    for (int l = 0; l < c_.n_layer; ++l) {
        if (kv_index_[(size_t)l] < 0 || kv_shared(l)) continue;  // (another stage's layer, no attention, or shared KV)
        const KvLayer &g = kvl(l);
        const size_t krun = (size_t)n * g.krow * el, vrun = (size_t)n * g.vrow * el;  // one head's K (V) rows
        for (int h = 0; h < g.heads; ++h) {
            uint8_t *ck = k + kv_k_at(slot, l, p0, h) * el, *cv = v + kv_v_at(slot, l, p0, h) * el;
            uint8_t *bk = bl + (size_t)h * krun, *bv = bl + (size_t)g.heads * krun + (size_t)h * vrun;
            if (save) { std::memcpy(bk, ck, krun); if (vrun) std::memcpy(bv, cv, vrun); }
            else { std::memcpy(ck, bk, krun); if (vrun) std::memcpy(cv, bv, vrun); }
        }
        bl += (size_t)g.heads * (krun + vrun);
    }
}

}  // namespace lowbit
