#include "matmul.h"
#include "repack.h"

#include <algorithm>
#include <numeric>
#include <cstdlib>
#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "threadpool.h"

namespace lowbit {

// Bytes of weight rows per tile when a chunk runs as several windows of 8 tokens: each window
// re-reads the tile's rows from cache (L2), and each window call has a fixed cost (the legacy
// kernels re-lay out their activations per call). 512 KB, half a 1 MB L2: measured on Zen 5
// (BENCHMARKS.md, 2026-12-02; 256 MB of rows, one thread, windows only), us per row and token
// at 16 tokens for 32 / 128 / 256 / 512 / 1024 KB: Q8_0 0.0346 / 0.0234 / 0.0211 / 0.0157 /
// 0.0158, Q4_1 0.0257 / 0.0216 / 0.0166 / 0.0158 / 0.0173, Q4_K 0.026 / 0.024 / 0.023 / 0.023 /
// 0.028 (its windows have no per-call cost). LOWBIT_TILE_KB=N overrides (A/B runs).
static const size_t kTileBytes = [] {
    const char *e = std::getenv("LOWBIT_TILE_KB");
    const long kb = e && *e ? std::atol(e) : 0;
    return kb > 0 ? (size_t)kb * 1024 : (size_t)512 * 1024;
}();
// Rows of per_row bytes in one tile (at least one)
static int64_t rows_in_tile(size_t per_row) { return per_row >= kTileBytes ? 1 : (int64_t)(kTileBytes / per_row); }
// A tile of e's rows: whole groups of 8 for a repacked layout's kernels (KernelTable::r8),
// which compute a group the tile cuts whole, for the rows of each side.
static int64_t tile_rows(const KernelEntry &e, int64_t rows) {
    return r8_format(e.count_id) != e.count_id ? std::max<int64_t>(kR8Rows, rows / kR8Rows * kR8Rows) : rows;
}

// Each window's kernel must exist; count it once per call (per window, not per tile). With
// `other`, e is one matrix of a fused GLU and other the other's: their common windows.
static void check_and_count(const Format &f, const KernelEntry &e, int isa, int64_t nt, int64_t rows,
                            const KernelEntry *other = nullptr) {
    for (int64_t t0 = 0, ntc; t0 < nt; t0 += ntc) {
        ntc = other ? glu_window(e, *other, nt - t0) : next_window(e, nt - t0);
        if (!window_kernel(e, (int)ntc).fn) throw std::invalid_argument(std::string("no row kernel for ") + f.name);
        count_call(count_id(f.id, e), (int)ntc, isa, rows);
    }
}
// How many windows a chunk of nt tokens takes (no GEMM).
static int64_t window_count(const KernelEntry &e, int64_t nt) {
    int64_t w = 0;
    for (int64_t t0 = 0; t0 < nt; t0 += next_window(e, nt - t0)) ++w;
    return w;
}

// One pool dispatch: part i takes its contiguous share of [0, rows) (split_range, so a
// row's result never depends on the split: I3) and calls body(tb, te) on each tile. Parts,
// not threads: up to parts_per_thread (below) per thread (of >= 16 rows), claimed dynamically by
// the pool.
// Parts per thread of a dispatch of 1-3 tokens: 2 (a descheduled thread delays at most half of
// its share; the other thread takes its unclaimed part). Each part is a claim on a counter both cores
// write, a kernel call's setup, and a jump in each thread's stream of rows. On a quiet Zen 5
// (BENCHMARKS.md, 2026-12-04 (5)), the default model's decode step 1.09x and its 8-token step
// 1.12x faster with 2 than with 4 (medians of 8 alternated runs); 1 was within noise of 2; the
// 8B-shaped slice's decode and prefill unchanged; with a CPU hog beside them 2 and 4 were equal.
// (On a quiet Zen 3, 1 and 4 were within noise: BENCHMARKS.md 2026-12-02 evening.)
// LOWBIT_PARTS=N overrides all three counts (A/B runs, tests of I3).
static int64_t parts_env(int64_t otherwise) {
    const char *e = std::getenv("LOWBIT_PARTS");
    const long v = e && *e ? std::atol(e) : 0;
    return v > 0 ? (int64_t)v : otherwise;
}
static const int64_t kPartsPerThread = parts_env(2);
// A dispatch that runs a GEMM (a prompt chunk: each part is milliseconds of work, so a claim's
// cost is nothing beside it) takes 8 parts per thread: a thread whose core is shared with another
// job (or simply slower) takes fewer of them, where with 2 the other thread waited for its last
// one (a profile of the default model's 512-token prefill on a shared Zen 3: the calling thread
// spent 20% of its time waiting for the worker at the end of the GEMMs' dispatches). Zen 3, 2
// threads, the default model's prefill, LOWBIT_PARTS=2 against 8 in alternated processes (medians
// of 5 prefills each, 6 rounds, sorted): 568-720 against 619-784 tok/s (BENCHMARKS.md round (19)).
static const int64_t kGemmPartsPerThread = parts_env(8);
// Windows of 4 or more tokens (a server step of several clients, a verify window): 4 parts per
// thread. Their dispatches are compute-bound and 3-8x longer than a one-token step's, so a claim
// costs little beside a part, and a thread held up by the host gives up a quarter of its share,
// not half. Zen 3 (shared), 2 threads, the default model's 8-token step back to back
// (tools/bench_step_cost.py 2 --loop 8 5), LOWBIT_PARTS=2 and 4 alternated 5 times: 4 faster in
// every round (16.0-19.4 against 14.7-16.0 ms), 8 no better than 4; the one-token step even
// between 2 and 4 (BENCHMARKS.md round (20)). Against it, round 2026-12-04 (5) above: a quiet Zen 5
// had 2 faster at 8 tokens (1.12x).
static const int64_t kWindowPartsPerThread = parts_env(4);
static int64_t parts_per_thread(bool gemm, int64_t nt) {
    return gemm ? kGemmPartsPerThread : nt >= 4 ? kWindowPartsPerThread : kPartsPerThread;
}
// Parts of decreasing size (part i of n: a share n - i of n (n + 1) / 2) for the windows of 4 or
// more tokens: parts are claimed in order, so the last ones, which decide how long one thread
// waits for the other at the dispatch's end, are the smallest (with equal parts that wait was
// half a part on average: the caller's 6% of a server step's samples in ThreadPool::run, round
// 26). LOWBIT_GUIDED=0: equal parts (A/B runs).
static const bool kGuided = [] {
    const char *e = std::getenv("LOWBIT_GUIDED");
    return !(e && *e == '0');
}();
// [*b, *e) of part i of nth over [0, units): shares nth - i of nth (nth + 1) / 2, in order
static void split_decreasing(int64_t units, int i, int nth, int64_t *b, int64_t *e) {
    const int64_t total = (int64_t)nth * (nth + 1) / 2;
    const auto start = [&](int k) {  // units before part k: the shares nth, nth - 1, ... of parts < k
        const int64_t before = (int64_t)k * nth - (int64_t)k * (k - 1) / 2;
        return units * before / total;
    };
    *b = start(i), *e = start(i + 1);
}
// align: every part starts at a multiple of it (rows a multiple of it; ActOut's blocks); per_thread:
// parts_per_thread's count for the dispatch; decreasing: split_decreasing's parts.
template <class Body>
static void for_row_tiles(int64_t rows, int64_t tile, int threads, const Body &body, int64_t align,
                          int64_t per_thread, bool decreasing = false) {
    const int64_t units = rows / align;
    const int64_t want = threads > 1 ? std::max<int64_t>(threads, std::min<int64_t>((int64_t)threads * per_thread, rows / 16)) : 1;
    const int64_t parts = std::clamp<int64_t>(want, 1, units);
    decreasing = decreasing && kGuided && units >= parts * (parts + 1) / 2;  // (every part at least a unit)
    ThreadPool::instance().run((int)parts, [&](int i, int nthr) {
        int64_t b, en;
        if (decreasing) split_decreasing(units, i, nthr, &b, &en);
        else split_range(units, i, nthr, &b, &en);
        b *= align, en *= align;
        for (int64_t tb = b; tb < en; tb += tile) body(tb, tb + tile < en ? tb + tile : en);
    });
}

// The rows a GEMM dispatch's parts start on multiples of: the GEMMs' row groups (KernelEntry::
// gemm_rows; the amx level's 16) where every matrix's rows are a multiple of it (else 1: a part
// boundary inside a group only costs work). With parts of any row, the default model's 512-token
// prefill ran the amx GEMMs on groups up to a third past their parts' rows (q, k and v laid end
// to end in 16 parts of 60 rows): 0.75x the avx512 level's prefill (BENCHMARKS.md round 23).
template <class Jobs, class Entry, class Rows>
static int64_t gemm_align(const Jobs &jobs, const Entry &gemm_entry, const Rows &rows) {
    int64_t g = 1;
    for (const auto &j : jobs)
        if (const KernelEntry *e = gemm_entry(j)) g = std::lcm<int64_t>(g, e->gemm_rows);
    for (const auto &j : jobs)
        if (rows(j) % g) return 1;
    return g;
}

// The rows of one matrix as a piece of a run_rows_multi dispatch: tile size and GEMM choice
// are the matrix's own, exactly as a run_rows call on it alone would pick them.
struct RowsPlan {
    const RowJob *j;
    int64_t gemm;  // the tokens the GEMM takes (gemm_tokens: 0, nt, or nt less a tail for the windows)
    uint64_t id;   // names the call's activations (RowArgs::act_id): the GEMM's panel and the
                   // window kernels' re-layout are built once per thread and dispatch
    int64_t tile;  // rows per tile
};

static int64_t gemm_align(const std::vector<RowsPlan> &plan) {
    return gemm_align(plan, [](const RowsPlan &p) { return p.gemm ? p.j->e : nullptr; },
                      [](const RowsPlan &p) { return p.j->r1 - p.j->r0; });
}

// Rows [tb, te) of job p (relative to its r0), every window of tokens.
static void rows_piece(const RowsPlan &p, const uint8_t *act, size_t act_stride, int64_t nt, int64_t n, int64_t tb,
                       int64_t te) {
    const RowJob &j = *p.j;
    if (p.gemm)
        gemm_kernel(*j.e, p.gemm).fn(RowArgs{j.w, j.w_stride, act, act_stride, j.out, j.out_stride, n, j.w_scale, p.id},
                                     j.r0 + tb, j.r0 + te, (int)p.gemm);
    for (int64_t t0 = p.gemm, ntc; t0 < nt; t0 += ntc) {
        ntc = next_window(*j.e, nt - t0);
        RowArgs a{j.w, j.w_stride, act + (size_t)t0 * act_stride, act_stride, j.out + (size_t)t0 * j.out_stride,
                  j.out_stride, n, j.w_scale, p.id};
        window_kernel(*j.e, (int)ntc).fn(a, j.r0 + tb, j.r0 + te, (int)ntc);
    }
}

// One pool dispatch per call, whatever the window count and the number of matrices: the
// matrices' rows are laid end to end ([0, rows of the 1st), then the 2nd's, ...) and split
// into parts as one range; a part runs, matrix by matrix, its share of each, tile by tile
// (kTileBytes of weight rows, so they stay in L2 while every window of tokens reads them), each
// window's kernel over the tile. A (row, token) pair is computed by the same kernel on the same
// bytes as with one dispatch per matrix and window (windows are cut the same way: tokens
// t0..t0+7), so results are bitwise unchanged (I2, I3); a prompt chunk pays one barrier instead
// of one per 8 tokens, streams each weight row from memory once, and q, k and v of a decode step
// (several small matrices on one input) pay one barrier instead of three.
void run_rows_multi(const RowJob *jobs, int n_jobs, int isa, const uint8_t *act, size_t act_stride, int64_t nt,
                    int64_t n, int threads) {
    std::vector<RowsPlan> plan((size_t)n_jobs);
    // One id for the dispatch: every job reads the same activations, so a thread that built a
    // kernel's re-layout (or GEMM panel) for one matrix reuses it for the next matrix of the same
    // kernel (q, k and v of a decode step); each kernel keys its own buffer by its layout.
    const uint64_t id = new_act_id();
    int64_t total = 0;
    bool any_gemm = false;
    for (int k = 0; k < n_jobs; ++k) {
        const RowJob &j = jobs[k];
        const int64_t rows = j.r1 - j.r0;
        // The entry's GEMM, when it has one and the chunk is long enough, takes the chunk's tokens
        // (gemm_tokens: all, or all but a short tail for the windows) in one call per tile (same
        // per-token results: KernelEntry::gemm); it tiles its rows itself and builds its
        // activation panel once per call: one call per part. (A GEMM that leaves a tail goes
        // tile by tile, so the tail's windows find the tile's rows in L2.)
        const int64_t gemm = gemm_tokens(*j.e, nt);
        if (gemm) count_call(count_id(j.f->id, *j.e), 0, gemm_level(*j.e, gemm, isa), rows);
        if (gemm < nt) check_and_count(*j.f, *j.e, isa, nt - gemm, rows);
        const bool tiled = gemm ? gemm < nt : window_count(*j.e, nt) > 1;
        const int64_t tile = tiled ? tile_rows(*j.e, rows_in_tile(j.w_stride)) : rows;
        plan[(size_t)k] = RowsPlan{&j, gemm, id, tile};
        total += rows;
        any_gemm = any_gemm || gemm;
    }
    // Windows over an R8 layout compute a group of 8 rows whole, for each part that cuts it: the
    // parts start on groups where every matrix's rows allow
    int64_t align = gemm_align(plan);
    if (!any_gemm) {
        bool r8 = false, whole = true;
        for (const RowsPlan &p : plan) {
            r8 = r8 || r8_format(p.j->e->count_id) != p.j->e->count_id;
            whole = whole && (p.j->r1 - p.j->r0) % kR8Rows == 0;
        }
        if (r8 && whole) align = std::lcm<int64_t>(align, kR8Rows);
    }
    for_row_tiles(total, total, threads, [&](int64_t b, int64_t e) {
        int64_t base = 0;  // where job k's rows start in the laid-out range
        for (const RowsPlan &p : plan) {
            const int64_t rows = p.j->r1 - p.j->r0, lo = std::max(b, base) - base, hi = std::min(e, base + rows) - base;
            for (int64_t tb = lo; tb < hi; tb += p.tile)
                rows_piece(p, act, act_stride, nt, n, tb, tb + p.tile < hi ? tb + p.tile : hi);
            base += rows;
        }
    }, align, parts_per_thread(any_gemm, nt), !any_gemm && nt >= 4);
}

void run_rows(const Format &f, const KernelEntry &e, int isa, const uint8_t *w, size_t w_stride,
              const uint8_t *act, size_t act_stride, int64_t nt, float *out, size_t out_stride,
              int64_t n, float w_scale, int64_t r0, int64_t r1, int threads) {
    const RowJob j{&f, &e, w, w_stride, w_scale, out, out_stride, r0, r1};
    run_rows_multi(&j, 1, isa, act, act_stride, nt, n, threads);
}

uint64_t new_act_id() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
}


int64_t glu_tile_rows(const RowMat &gate, const RowMat &up, int64_t nt) {
    // The GEMM (both matrices have one that takes nt tokens): 256 rows per call, so that its
    // activation panel (built once per call) is amortised over many rows; scratch 2 x 256 x nt.
    const int64_t gemm = glu_gemm_tokens(*gate.e, *up.e, nt);
    if (gemm == nt) return 256;
    // One window (decode, a short verify window): the weights are read once whatever the
    // tile; 128 rows keep the scratch (128 x nt x 2 floats) in L1 for the epilogue.
    // Several windows, or the GEMM and a tail of windows: gate and up rows of kTileBytes,
    // re-read from L2 by each window.
    if (!gemm && glu_window(*gate.e, *up.e, nt) >= nt) return 128;
    return tile_rows(*gate.e, tile_rows(*up.e, rows_in_tile(gate.stride + up.stride)));
}

void glu_rows(const RowMat &gate, const uint8_t *act_g, size_t act_g_stride, const RowMat &up,
              const uint8_t *act_u, size_t act_u_stride, int64_t nt, int64_t n, glu_fn glu, int kind,
              int64_t rb, int64_t re, int64_t tile, float *out, size_t out_stride,
              const float *bias_g, const float *bias_u, uint64_t act_id, const ActOut *q) {
    thread_local std::vector<float> scratch;  // [ntc][tr] gate values, then [ntc][tr] up values
    // The GEMM, when both matrices have one for nt tokens, takes the chunk per tile (one "window"
    // of its tokens: glu_gemm_tokens), the windows of glu_window (16 or <= 8 tokens) the rest (a
    // short tail, or the whole chunk below the gate). Per token the same values either way (I8),
    // and the epilogue below is per token.
    const int64_t gemm = glu_gemm_tokens(*gate.e, *up.e, nt);
    const int64_t wmax = std::max<int64_t>(gemm, glu_window(*gate.e, *up.e, nt));  // the widest window
    const int64_t tmax = tile < re - rb ? tile : re - rb;
    const size_t need = (size_t)2 * (size_t)tmax * (size_t)wmax;
    if (scratch.size() < need) scratch.resize(need);
    for (int64_t tb = rb; tb < re; tb += tile) {
        const int64_t te = tb + tile < re ? tb + tile : re, tr = te - tb;
        for (int64_t t0 = 0, ntc; t0 < nt; t0 += ntc) {
            const bool g = t0 < gemm;  // (the GEMM's tokens first, then the windows' tail)
            ntc = g ? gemm : glu_window(*gate.e, *up.e, nt - t0);
            float *G = scratch.data(), *U = G + (size_t)tr * ntc;
            // the tile's rows seen as rows [0, tr) of a matrix starting at row tb (I3: a row's
            // result does not depend on where the range starts), token t's at G[t * tr + r]
            if (gate.w) {  // (no gate: an ungated FFN, below)
                RowArgs a{gate.w + (size_t)tb * gate.stride, gate.stride, act_g + (size_t)t0 * act_g_stride,
                          act_g_stride, G, (size_t)tr, n, gate.scale, act_id};
                (g ? gemm_kernel(*gate.e, ntc).fn : window_kernel(*gate.e, (int)ntc).fn)(a, 0, tr, (int)ntc);
            }
            RowArgs b{up.w + (size_t)tb * up.stride, up.stride, act_u + (size_t)t0 * act_u_stride,
                      act_u_stride, U, (size_t)tr, n, up.scale, act_id};
            (g ? gemm_kernel(*up.e, ntc).fn : window_kernel(*up.e, (int)ntc).fn)(b, 0, tr, (int)ntc);
            if (gate.out_scale != 1.0f)
                for (int64_t i = 0; i < tr * ntc; ++i) G[i] *= gate.out_scale;
            if (up.out_scale != 1.0f)
                for (int64_t i = 0; i < tr * ntc; ++i) U[i] *= up.out_scale;
            for (int t = 0; t < ntc && (bias_g || bias_u); ++t)
                for (int64_t i = 0; i < tr; ++i) {
                    if (bias_g) G[(size_t)t * tr + i] += bias_g[tb + i];
                    if (bias_u) U[(size_t)t * tr + i] += bias_u[tb + i];
                }
            for (int t = 0; t < ntc; ++t) {
                float *o = out + (size_t)(t0 + t) * out_stride + tb;
                if (!gate.w) {  // ungated (nemotron_h's experts): relu(up)^2, ggml's relu then sqr
                    for (int64_t i = 0; i < tr; ++i) {
                        const float v = U[(size_t)t * tr + i], r = v > 0.0f ? v : 0.0f;
                        o[i] = r * r;
                    }
                } else {
                    glu(G + (size_t)t * tr, U + (size_t)t * tr, o, tr, kind);
                }
                if (q) q->put(o, t0 + t, tb, tr);
            }
        }
    }
}

void run_rows_glu(const RowMat &gate, const RowMat &up, const GluKernel &glu, int kind, int isa,
                  const uint8_t *act, size_t act_stride, int64_t nt, float *out, size_t out_stride, int64_t n,
                  int64_t rows, int threads, const ActOut *q) {
    if (!glu.fn) throw std::invalid_argument("no GLU epilogue at this level");
    if (q && (q->block <= 0 || rows % q->block != 0))
        throw std::invalid_argument("run_rows_glu: the quantized output's blocks do not divide the rows");
    if (kind != GLU_SILU && kind != GLU_RELU2 && kind != GLU_GEGLU)
        throw std::invalid_argument("unknown GLU kind " + std::to_string(kind));
    if (gate.f->act != up.f->act)
        throw std::invalid_argument(std::string("gate (") + gate.f->name + ") and up (" + up.f->name +
                                    ") pair with different activation formats: run them apart");
    const int64_t gemm = glu_gemm_tokens(*gate.e, *up.e, nt);
    if (gemm) {
        count_call(count_id(gate.f->id, *gate.e), 0, gemm_level(*gate.e, gemm, isa), rows);
        count_call(count_id(up.f->id, *up.e), 0, gemm_level(*up.e, gemm, isa), rows);
    }
    if (gemm < nt) {
        check_and_count(*gate.f, *gate.e, isa, nt - gemm, rows, up.e);
        check_and_count(*up.f, *up.e, isa, nt - gemm, rows, gate.e);
    }
    count_glu(kind, glu.isa, rows, rows * nt);
    // parts and tiles start on a multiple of the quantized output's blocks, and of an R8 layout's
    // groups of 8 rows (its kernels see a tile's rows as a matrix of their own: its groups must
    // be the matrix's)
    int64_t align = q ? q->block : 1;
    if (r8_format(gate.e->count_id) != gate.e->count_id || r8_format(up.e->count_id) != up.e->count_id)
        align = std::lcm<int64_t>(align, kR8Rows);
    if (rows % align)
        throw std::invalid_argument("run_rows_glu: the rows are not a multiple of the blocks and groups they take");
    if (gemm) {  // (and of the GEMMs' row groups, where the rows allow)
        const KernelEntry *es[2] = {gate.e, up.e};
        const int64_t with = std::lcm<int64_t>(
            align, gemm_align(es, [](const KernelEntry *e) { return e; }, [&](const KernelEntry *) { return rows; }));
        if (rows % with == 0) align = with;
    }
    const int64_t tile = std::max(align, glu_tile_rows(gate, up, nt) / align * align);
    const uint64_t id = new_act_id();
    for_row_tiles(rows, tile, threads, [&](int64_t tb, int64_t te) {
        glu_rows(gate, act, act_stride, up, act, act_stride, nt, n, glu.fn, kind, tb, te, tile, out, out_stride,
                 nullptr, nullptr, id, q);
    }, align, parts_per_thread(gemm != 0, nt), gemm == 0 && nt >= 4);
}

bool ActOut::blockwise(int act_format) { return act_format == T_Q8_0 || act_format == T_Q8_1 || act_format == T_Q8_K; }

}  // namespace lowbit
