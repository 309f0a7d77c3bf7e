// nanobind module _lowbit: a thin layer over the kernel table. It checks every size
// before touching memory (std::invalid_argument -> ValueError) and releases the GIL
// around native work. The Python package (src/lowbit) gives the friendly API.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <cmath>
#include <stdexcept>
#include <string>

#include "bench.h"
#include "dispatch.h"
#include "engine.h"
#include "formats.h"
#include "kernels.h"
#include "matmul.h"
#include "quant/quant.h"
#include "ref/ref.h"
#include "repack.h"
#include "threadpool.h"
#include "x86/prefetch.h"  // kPrefetchAhead (cpu_info)
#define LOWBIT_AMX_EMULATE 1  // (the emulator's side only: amx_emulator_dp below)
#include "x86/amx_tiles.h"

namespace nb = nanobind;
using namespace lowbit;

using U8In = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using F32In = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using F32Out = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

static const Format &fmt(int id) {
    const Format *f = format_by_id(id);
    if (!f) throw std::invalid_argument("unknown format id " + std::to_string(id));
    return *f;
}

static void check_n(const Format &f, int64_t n) {
    if (n <= 0 || n % f.block != 0)
        throw std::invalid_argument(std::string(f.name) + ": n=" + std::to_string(n) +
                                    " is not a positive multiple of the block size " + std::to_string(f.block));
}

// Weight rows: raw[rows, row_bytes(n)] (+ the format's tensor pad counted in the last dim
// only when passed as one flat row; see w_scale). Returns row stride.
static size_t check_weights(const Format &f, const U8In &raw, int64_t n) {
    check_n(f, n);
    if (!f.weight) throw std::invalid_argument(std::string(f.name) + " is not a weight format");
    const size_t rb = row_bytes(&f, n);
    if ((size_t)raw.shape(1) != rb)
        throw std::invalid_argument(std::string(f.name) + ": a row of n=" + std::to_string(n) + " needs " +
                                    std::to_string(rb) + " bytes, got " + std::to_string(raw.shape(1)));
    return rb;
}

template <class T>
static nb::ndarray<nb::numpy, T, nb::ndim<2>> new_array(size_t rows, size_t cols, T **data) {
    T *p = new T[rows * cols > 0 ? rows * cols : 1]();
    nb::capsule owner(p, [](void *q) noexcept { delete[] (T *)q; });
    *data = p;
    size_t shape[2] = {rows, cols};
    return nb::ndarray<nb::numpy, T, nb::ndim<2>>(p, 2, shape, owner);
}

// act[nt, arb]: nt >= 1 tokens quantized to af for rows of n values; out[nt, rows]. Shapes
// agree, or a one-line error before any native code runs.
static void check_act_out(const Format &af, size_t arb, int64_t n, const U8In &act, const F32Out &out, int64_t rows) {
    const int64_t nt = (int64_t)act.shape(0);
    if ((size_t)act.shape(1) != arb)
        throw std::invalid_argument(std::string(af.name) + " activations for n=" + std::to_string(n) + " need " +
                                    std::to_string(arb) + " bytes per token, got " + std::to_string(act.shape(1)));
    if (nt < 1) throw std::invalid_argument("need at least one token (nt >= 1)");
    if ((int64_t)out.shape(0) != nt || (int64_t)out.shape(1) != rows)
        throw std::invalid_argument("out must have shape (nt, rows) = (" + std::to_string(nt) + ", " +
                                    std::to_string(rows) + ")");
}

// isa < 0: what dispatch selected; otherwise that level's table (tests compare levels).
static const KernelEntry &entry(int id, int isa) {
    if (isa < 0) return kernel_entry(id);
    if (!level_available(isa))
        throw std::invalid_argument(std::string("ISA level ") + isa_name(isa) +
                                    " is not available here (CPU, build or LOWBIT_MAX_ISA)");
    return kernel_entry_at(id, isa);
}

// A format's rows repacked to its R8 layout into r8 (benchmarks and tests of that layout's kernels)
using RepackedBytes = std::unique_ptr<uint8_t, void (*)(void *)>;
static const uint8_t *repack_for_bench(const Format &f, const U8In &raw, int64_t n, int64_t rows, size_t rb,
                                       RepackedBytes &r8, int isa) {
    if (r8_id(f.id) < 0)
        throw std::invalid_argument(std::string(f.name) + " has no repacked layout (Q4_K, Q5_K, Q4_0, Q4_1, Q8_0 and IQ4_XS have: R8)");
    if (!entry(r8_id(f.id), isa).rows[1].fn)
        throw std::invalid_argument(std::string("no kernels for ") + f.name + "'s R8 layout at this level");
    if (rows % kR8Rows) throw std::invalid_argument("the R8 layout needs a multiple of 8 rows");
    if (!r8_takes(f.id, n)) throw std::invalid_argument(std::string(f.name) + "'s R8 layout needs rows of a multiple of 64 values");
    r8.reset(alloc_repacked((size_t)rows * rb));  // (as the engine's: Engine::repack)
    repack_r8(f.id, raw.data(), rb, rows, n, r8.get());
    return r8.get();
}

// path: 0 = as dispatched; 1 = the row kernels only (the GEMM off: the wide window where it
// takes, windows of <= 8); 2 = the entry's GEMM for every nt; 3 = windows of <= 8 only (the
// GEMM and the wide window off). Tests and benchmarks compare the paths of one level.
static KernelEntry with_path(const KernelEntry &e, int path) {
    KernelEntry c = e;
    if (path == 1 || path == 3) c.gemm = c.gemm_low = RowKernel{}, c.gemm_min_nt = c.gemm_cross = 0;
    if (path == 3) c.wide = RowKernel{};
    if (path == 2) {
        if (!e.gemm.fn) throw std::invalid_argument("this format has no GEMM at this level");
        c.gemm_min_nt = 1, c.gemm_tail = 0;  // (every token through the GEMM: the entry's own)
        c.gemm_low = RowKernel{}, c.gemm_cross = 0;
    }
    return c;
}

// (key, kernel, calls, rows, values) per OpStat, for glu_stats / quant_stats
static std::vector<nb::tuple> op_stat_tuples(const std::vector<OpStat> &stats) {
    std::vector<nb::tuple> out;
    for (const OpStat &s : stats)
        out.push_back(nb::make_tuple(s.key, s.kernel ? std::string(s.kernel) : std::string("?"), s.calls, s.rows, s.values));
    return out;
}

// The GLU epilogue of level isa (-1: the selected one); an error if this CPU lacks the level.
static const GluKernel &glu_at(int isa) {
    if (isa >= 0 && !level_available(isa))
        throw std::invalid_argument(std::string("ISA level ") + isa_name(isa) + " is not available here");
    return kernel_table(isa).glu;
}

static int threads_or_default(int threads) {
    const int pool = ThreadPool::instance().size();
    if (threads <= 0) return pool;
    return threads < pool ? threads : pool;
}

// the attention kernels' softcap: 0 (none) or a finite positive cap
static void check_softcap(float softcap) {
    if (!(softcap >= 0.0f) || !std::isfinite(softcap)) throw std::invalid_argument("softcap must be a finite number >= 0");
}

NB_MODULE(_lowbit, m) {
    m.doc() = "lowbit native kernels (private; use the lowbit package)";

    m.def("formats", [] {
        std::vector<nb::tuple> out;
        for (const Format *f = formats_begin(); f != formats_end(); ++f)
            out.push_back(nb::make_tuple(f->id, f->name, f->block, f->bytes, f->act, f->weight, f->activation));
        return out;
    }, "All formats: (id, name, block, bytes, act id, is weight, is activation).");

    m.def("row_bytes", [](int id, int64_t n) { const Format &f = fmt(id); check_n(f, n); return row_bytes(&f, n); });
    m.def("tensor_pad", [](int id) { return tensor_pad(&fmt(id)); });

    m.def("cpu_info", [] {
        const CpuInfo &c = cpu_info();
        nb::dict d;
        d["model"] = c.model;
        d["features"] = c.features;
        d["best"] = std::string(isa_name(c.best));
        d["built"] = std::string(isa_name(c.built));
        d["cap"] = std::string(isa_name(c.cap));
        d["selected"] = std::string(isa_name(c.selected));
        d["threads"] = ThreadPool::instance().size();
        d["disabled"] = disabled_kernels();
        d["attention"] = std::string(kernel_table().attn.name);
        d["attention_mla"] = std::string(kernel_table().mla.name);
        d["attention_q"] = std::string(kernel_table().attnq.name);
        d["attention_q_rows"] = std::string(kernel_table().attnq_rows.name);
        d["glu"] = std::string(kernel_table().glu.name);
        d["delta"] = std::string(kernel_table().delta.name);
        d["scan"] = std::string(kernel_table().scan.name);
        d["amx_emulated"] = c.amx_emulated;  // LOWBIT_AMX=emulate: the amx level runs on the emulator
        d["amx_bf16"] = c.amx_bf16;  // AMX-BF16 usable: the amx level runs BF16 on tiles
        d["notes"] = c.notes;
        d["prefetch"] = (long long)kPrefetchAhead;
        d["iq_grid"] = std::string(iq_grid_by_loads() ? "loads" : "gather");  // the IQ3 kernels' grid fetch
#if defined(__clang__)
        d["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
        d["compiler"] = std::string("GCC ") + __VERSION__;
#else
        d["compiler"] = std::string("unknown");
#endif
        return d;
    });

    m.def("kernel", [](int id, int nt, int isa) -> nb::object {
        if (r8_format(id) == id) fmt(id);  // (else an R8 layout's id: kQ4kR8Id, kQ5kR8Id; repack.h)
        if (nt < 1 || nt > MAX_NT) throw std::invalid_argument("nt must be in 1..8");
        const RowKernel &k = entry(id, isa).rows[nt];
        if (!k.fn) return nb::none();
        return nb::make_tuple(std::string(k.name), std::string(isa_name(k.isa)));
    }, nb::arg("id"), nb::arg("nt"), nb::arg("isa") = -1,
       "(kernel name, level) that runs for format id and window nt, or None.");
    m.def("kv_store_row", [](int type, nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> x) {
        // One KV cache row as the engine writes it (T_F16, T_Q8_0 or T_Q4_0): uint8[row bytes].
        const int64_t n = (int64_t)x.shape(0);
        if (type != T_F16 && type != T_Q8_0 && type != T_Q4_0) throw std::invalid_argument("kv_store_row: type must be F16, Q8_0 or Q4_0");
        if (n < 1 || (type != T_F16 && n % QK)) throw std::invalid_argument("kv_store_row: n must be a positive multiple of 32");
        const size_t rb = type == T_F16 ? (size_t)n * 2 : row_bytes(format_by_id(type), n);
        uint8_t *p;
        auto out = new_array<uint8_t>(1, rb, &p);
        kv_store_row(type, x.data(), n, p);
        return out;
    }, nb::arg("type"), nb::arg("x"));
    m.def("attend_q", [](nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> q, int k_type,
                         nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> K, int v_type,
                         nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> V, float scale,
                         int isa, float sink, float softcap) {
        // One query row against cache rows K/V[len, row bytes] (head 0 of each row), q quantized
        // to Q8_0 first (the level's quantizer: byte-identical at every level).
        const AttnQKernel &k = kernel_table(isa).attnq;
        check_softcap(softcap);
        if (!k.fn) throw std::invalid_argument(std::string("ISA level ") + isa_name(isa) + " is not available here");
        const int hd = (int)q.shape(0);
        const size_t len = K.shape(0);
        if (hd < 32 || hd % 32 || hd > 512) throw std::invalid_argument("attend_q: head_dim must be a multiple of 32 in 32..512");
        if ((k_type != T_Q8_0 && k_type != T_Q4_0) || (v_type != T_F16 && v_type != T_Q8_0 && v_type != T_Q4_0))
            throw std::invalid_argument("attend_q: K must be Q8_0 or Q4_0, V F16, Q8_0 or Q4_0");
        auto rb = [&](int t) { return t == T_F16 ? (size_t)hd * 2 : row_bytes(format_by_id(t), hd); };
        if (len < 1 || V.shape(0) != len || K.shape(1) < rb(k_type) || V.shape(1) < rb(v_type))
            throw std::invalid_argument("attend_q: K and V must be [len >= 1, >= one head's row bytes]");
        std::vector<float> sc(len);
        std::vector<uint8_t> qq(row_bytes(format_by_id(T_Q8_0), hd));
        float *o;
        auto out = new_array<float>(1, (size_t)hd, &o);
        {
            nb::gil_scoped_release nogil;
            kernel_table(isa).at(T_Q8_0).quant_act.fn(q.data(), qq.data(), hd);
            k.fn(qq.data(), k_type, K.data(), K.shape(1), v_type, V.data(), V.shape(1), (int)len, hd, scale, sink,
                 softcap, sc.data(), o);
        }
        return nb::make_tuple(out, std::string(k.name));
    }, nb::arg("q"), nb::arg("k_type"), nb::arg("K"), nb::arg("v_type"), nb::arg("V"), nb::arg("scale"),
       nb::arg("isa") = -1, nb::arg("sink") = -INFINITY, nb::arg("softcap") = 0.0f);
    m.def("attend_q_rows", [](nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> q, int k_type,
                              nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> K, int v_type,
                              nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> V, float scale,
                              int isa, std::vector<int32_t> lens, std::vector<float> sinks, float softcap) {
        // q[nq][hd] (each row quantized to Q8_0 by the level's quantizer) sharing cache rows K/V[len,
        // row bytes] (head 0 of each row): the kernel attn_q_rows_fn; lens: each row's key count
        // (empty: all of K's rows), sinks: one per row (empty: none).
        const AttnQRowsKernel &k = kernel_table(isa).attnq_rows;
        check_softcap(softcap);
        if (!k.fn) throw std::invalid_argument(std::string("ISA level ") + isa_name(isa) + " is not available here");
        const int nq = (int)q.shape(0), hd = (int)q.shape(1);
        const size_t len = K.shape(0);
        if (nq < 1) throw std::invalid_argument("attend_q_rows: q needs at least one row");
        if (hd < 32 || hd % 32 || hd > 512) throw std::invalid_argument("attend_q_rows: head_dim must be a multiple of 32 in 32..512");
        if ((k_type != T_Q8_0 && k_type != T_Q4_0) || (v_type != T_F16 && v_type != T_Q8_0 && v_type != T_Q4_0))
            throw std::invalid_argument("attend_q_rows: K must be Q8_0 or Q4_0, V F16, Q8_0 or Q4_0");
        auto rb = [&](int t) { return t == T_F16 ? (size_t)hd * 2 : row_bytes(format_by_id(t), hd); };
        if (len < 1 || V.shape(0) != len || K.shape(1) < rb(k_type) || V.shape(1) < rb(v_type))
            throw std::invalid_argument("attend_q_rows: K and V must be [len >= 1, >= one head's row bytes]");
        if (lens.empty()) lens.assign((size_t)nq, (int32_t)len);
        if (lens.size() != (size_t)nq) throw std::invalid_argument("attend_q_rows: one length per query row");
        for (int32_t l : lens)
            if (l < 1 || (size_t)l > len) throw std::invalid_argument("attend_q_rows: each length must be in 1..len");
        if (!sinks.empty() && sinks.size() != (size_t)nq) throw std::invalid_argument("attend_q_rows: one sink per query row");
        std::vector<float> sc((size_t)nq * len);
        const size_t qrow = row_bytes(format_by_id(T_Q8_0), hd);
        std::vector<uint8_t> qq((size_t)nq * qrow);
        float *o;
        auto out = new_array<float>((size_t)nq, (size_t)hd, &o);
        {
            nb::gil_scoped_release nogil;
            const quant_act_fn q8 = kernel_table(isa).at(T_Q8_0).quant_act.fn;
            for (int r = 0; r < nq; ++r) q8(q.data() + (size_t)r * hd, qq.data() + r * qrow, hd);
            k.fn(qq.data(), nq, lens.data(), k_type, K.data(), K.shape(1), v_type, V.data(), V.shape(1), hd, scale,
                 sinks.empty() ? nullptr : sinks.data(), softcap, sc.data(), o);
        }
        return nb::make_tuple(out, std::string(k.name));
    }, nb::arg("q"), nb::arg("k_type"), nb::arg("K"), nb::arg("v_type"), nb::arg("V"), nb::arg("scale"),
       nb::arg("isa") = -1, nb::arg("lens") = std::vector<int32_t>{}, nb::arg("sinks") = std::vector<float>{},
       nb::arg("softcap") = 0.0f);
    m.def("attend_f16", [](nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> q,
                           nb::ndarray<const uint16_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> K,
                           nb::ndarray<const uint16_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> V, float scale,
                           int isa, float sink, float softcap) {
        // One query row against cache rows K/V[len, kd] (half bits), head 0 of each row.
        const AttnKernel &k = kernel_table(isa).attn;
        check_softcap(softcap);
        if (!k.fn) throw std::invalid_argument(std::string("ISA level ") + isa_name(isa) + " is not available here");
        const int hd = (int)q.shape(0);
        const size_t len = K.shape(0), kd = K.shape(1);
        if (hd < 8 || hd % 8 || hd > 512) throw std::invalid_argument("attend_f16: head_dim must be a multiple of 8 in 8..512");
        if (len < 1 || V.shape(0) != len || V.shape(1) != kd || kd < (size_t)hd)
            throw std::invalid_argument("attend_f16: K and V must both be [len >= 1, kd >= head_dim]");
        std::vector<float> sc(len);
        float *o;
        auto out = new_array<float>(1, (size_t)hd, &o);
        {
            nb::gil_scoped_release nogil;
            k.fn(q.data(), K.data(), V.data(), (int)len, hd, kd, scale, sink, softcap, sc.data(), o);
        }
        return nb::make_tuple(out, std::string(k.name));
    }, nb::arg("q"), nb::arg("K"), nb::arg("V"), nb::arg("scale"), nb::arg("isa") = -1,
       nb::arg("sink") = -INFINITY, nb::arg("softcap") = 0.0f,
       "The engine's attention kernel on one query row: (out[1, head_dim], kernel name); sink: an attention sink logit; "
       "softcap > 0: scores capped as Gemma 2's.");
    m.def("softcap_scores", [](nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> x, float cap) {
        // The attention soft-cap's spec (ref::softcap_scores, kernels.h): cap * attn_tanh(x / cap) per value.
        check_softcap(cap);
        if (cap == 0.0f) throw std::invalid_argument("softcap_scores: cap must be > 0");
        float *o;
        auto out = new_array<float>(1, x.shape(0), &o);
        std::memcpy(o, x.data(), sizeof(float) * x.shape(0));
        ref::softcap_scores(o, (int)x.shape(0), cap);
        return out;
    }, nb::arg("x"), nb::arg("cap"), "Gemma 2's attention soft-cap as every attention kernel computes it: float32[1, n].");
    m.def("attend_mla", [](nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> q,
                           nb::ndarray<const uint16_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> C, int dv,
                           float scale, int isa, std::vector<int32_t> lens,
                           std::optional<nb::ndarray<const uint16_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>> V,
                           std::vector<float> sinks, float softcap) {
        // q[nq][dk] against latent rows C[len][kd] (half bits): the MLA kernel (kernels.h mla_f16_fn);
        // lens: each row's key count (empty: all rows of C).
        const MlaKernel &k = kernel_table(isa).mla;
        check_softcap(softcap);
        if (!k.fn) throw std::invalid_argument(std::string("ISA level ") + isa_name(isa) + " is not available here");
        const int nq = (int)q.shape(0), dk = (int)q.shape(1);
        const size_t len = C.shape(0), kd = C.shape(1);
        if (nq < 1 || dk < 8 || dk % 8 || dv < 8 || dv % 8 || dv > dk || len < 1 || kd < (size_t)dk)
            throw std::invalid_argument("attend_mla: need q[nq >= 1][dk], C[len >= 1][kd >= dk], dv <= dk, dk and dv multiples of 8");
        if (V && (V->shape(0) != len || V->shape(1) != kd))
            throw std::invalid_argument("attend_mla: V must have C's shape");
        if (!sinks.empty() && sinks.size() != (size_t)nq) throw std::invalid_argument("attend_mla: one sink per query row");
        if (lens.empty()) lens.assign((size_t)nq, (int32_t)len);
        if (lens.size() != (size_t)nq) throw std::invalid_argument("attend_mla: one length per query row");
        for (int32_t l : lens)
            if (l < 1 || (size_t)l > len) throw std::invalid_argument("attend_mla: each length must be in 1..len");
        std::vector<float> sc((size_t)nq * len);
        float *o;
        auto out = new_array<float>((size_t)nq, (size_t)dv, &o);
        {
            nb::gil_scoped_release nogil;
            k.fn(q.data(), nq, lens.data(), C.data(), V ? V->data() : C.data(), dk, dv, kd, scale,
                 sinks.empty() ? nullptr : sinks.data(), softcap, sc.data(), o);
        }
        return nb::make_tuple(out, std::string(k.name));
    }, nb::arg("q"), nb::arg("C"), nb::arg("dv"), nb::arg("scale"), nb::arg("isa") = -1,
       nb::arg("lens") = std::vector<int32_t>(), nb::arg("V") = nb::none(), nb::arg("sinks") = std::vector<float>(),
       nb::arg("softcap") = 0.0f,
       "The shared-rows attention kernel (MLA, a GQA group) on query rows q: (out[nq, dv], kernel name); lens: "
       "each row's key count; V: value rows apart from the keys' C (a GQA group); sinks: one per row.");
    m.def("delta_rule", [](nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu> M,
                           nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> k,
                           nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> q,
                           nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> v,
                           float decay, float beta, float scale, int isa) {
        // One token's gated delta rule on one head's state M[S, S] (updated in place).
        const DeltaKernel &dk = kernel_table(isa).delta;
        if (!dk.fn) throw std::invalid_argument(std::string("ISA level ") + isa_name(isa) + " is not available here");
        const size_t S = M.shape(0);
        if (S < 1 || M.shape(1) != S || k.shape(0) != S || q.shape(0) != S || v.shape(0) != S)
            throw std::invalid_argument("delta_rule: M must be [S, S] and k, q, v [S]");
        float *o;
        auto out = new_array<float>(1, S, &o);
        dk.fn(M.data(), k.data(), q.data(), v.data(), decay, beta, scale, o, (int)S);
        return nb::make_tuple(out, std::string(dk.name));
    }, nb::arg("M"), nb::arg("k"), nb::arg("q"), nb::arg("v"), nb::arg("decay"), nb::arg("beta"), nb::arg("scale"),
       nb::arg("isa") = -1, "The delta-net kernel on one token and head: (o[1, S], kernel name); M updated in place.");
    m.def("ssm_scan", [](nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu> s,
                         nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> B,
                         nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> C,
                         nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> x,
                         float dt, float dA, int isa) {
        // One token's Mamba-2 state update on one head's state s[P, N] (updated in place).
        const ScanKernel &k = kernel_table(isa).scan;
        if (!k.fn) throw std::invalid_argument(std::string("ISA level ") + isa_name(isa) + " is not available here");
        const size_t P = s.shape(0), N = s.shape(1);
        if (P < 1 || N < 1 || B.shape(0) != N || C.shape(0) != N || x.shape(0) != P)
            throw std::invalid_argument("ssm_scan: s must be [P, N], B and C [N], x [P]");
        float *y;
        auto out = new_array<float>(1, P, &y);
        k.fn(s.data(), B.data(), C.data(), x.data(), dt, dA, y, (int)P, (int)N);
        return nb::make_tuple(out, std::string(k.name));
    }, nb::arg("s"), nb::arg("B"), nb::arg("C"), nb::arg("x"), nb::arg("dt"), nb::arg("dA"), nb::arg("isa") = -1,
       "The Mamba-2 scan kernel on one token and head: (y[1, P], kernel name); s updated in place.");
    m.def("quant_act_kernel", [](int id, int isa) -> nb::object {
        const Format &f = fmt(id);
        if (!f.activation) throw std::invalid_argument(std::string(f.name) + " is not an activation format");
        const KernelEntry &e = entry(id, isa);
        if (!e.quant_act.fn) return nb::none();
        return nb::make_tuple(std::string(e.quant_act.name ? e.quant_act.name : "?"),
                              std::string(isa_name(e.quant_act.isa)));
    }, nb::arg("id"), nb::arg("isa") = -1,
       "(quantizer name, level) that quantizes activations into format id, or None.");
    m.def("levels", [] {
        std::vector<std::string> out;
        for (int i : isa_ladder())
            if (level_built(i)) out.push_back(isa_name(i));
        return out;
    }, "ISA levels with kernels of their own that can run here (CPU, build and LOWBIT_MAX_ISA allowing), lowest first.");
    // One tile product on the AMX emulator (csrc/x86/amx_tiles.h), for its tests: tmm0 = a (rows x
    // bytes as given), tmm1 = b, tmm4 = c_rows x c_colsb zeroes; c += a . b (uw: TDPBUSD, a unsigned
    // and b signed; else TDPBSUD); returns c as int32[c_rows, c_colsb / 4]. Shapes the hardware
    // would fault on raise (RuntimeError).
    m.def("amx_emulator_dp", [](U8In a, U8In b, bool uw, int c_rows, int c_colsb) {
        TileConfig cfg;
        cfg.set(0, (int)a.shape(0), (int)a.shape(1));
        cfg.set(1, (int)b.shape(0), (int)b.shape(1));
        cfg.set(4, c_rows, c_colsb);
        if (a.shape(0) > 16 || a.shape(1) > 64 || b.shape(0) > 16 || b.shape(1) > 64)
            throw std::invalid_argument("a tile holds at most 16 rows of 64 bytes");
        tile_loadconfig(cfg);
        tile_load<0>(a.data(), a.shape(1));
        tile_load<1>(b.data(), b.shape(1));
        tile_zero<4>();
        if (uw) tile_dp<4, 0, 1, true>();
        else tile_dp<4, 0, 1, false>();
        int32_t *o;
        auto out = new_array<int32_t>((size_t)c_rows, (size_t)(c_colsb / 4), &o);
        tile_store<4>(o, (size_t)(c_colsb / 4) * 4);
        tile_release();
        return out;
    }, nb::arg("a"), nb::arg("b"), nb::arg("uw"), nb::arg("c_rows"), nb::arg("c_colsb"));
    m.def("isa_names", [] {
        std::vector<std::string> out;
        for (int i = 0; i < ISA_COUNT; ++i) out.push_back(isa_name(i));
        return out;
    }, "Every level's name indexed by its native id (the isa argument of the other functions).");

    m.def("capabilities", [](int id) {
        const KernelEntry &e = kernel_entry(fmt(id).id);
        nb::dict d;
        d["rows"] = e.rows[1].fn != nullptr;
        d["dequantize"] = e.dequant != nullptr;
        d["quantize_act"] = e.quant_act.fn != nullptr;
        d["quantize"] = e.quant_w != nullptr;
        return d;
    });

    m.def("dequantize", [](int id, U8In raw, int64_t n, float w_scale, int isa) {
        const Format &f = fmt(id);
        check_n(f, n);
        const size_t rb = row_bytes(&f, n);
        if ((size_t)raw.shape(1) != rb)
            throw std::invalid_argument(std::string(f.name) + ": a row of n=" + std::to_string(n) + " needs " +
                                        std::to_string(rb) + " bytes, got " + std::to_string(raw.shape(1)));
        const KernelEntry &e = entry(id, isa);
        if (!e.dequant) throw std::invalid_argument(std::string("no dequantize for ") + f.name);
        const size_t rows = raw.shape(0);
        float *o;
        auto out = new_array<float>(rows, (size_t)n, &o);
        const uint8_t *src = raw.data();
        {
            nb::gil_scoped_release nogil;
            for (size_t r = 0; r < rows; ++r) e.dequant(src + r * rb, o + r * (size_t)n, n, w_scale);
        }
        return out;
    }, nb::arg("id"), nb::arg("raw"), nb::arg("n"), nb::arg("w_scale") = 1.0f, nb::arg("isa") = -1);

    m.def("quantize_act", [](int id, F32In x, int isa) {
        const Format &f = fmt(id);
        if (!f.activation) throw std::invalid_argument(std::string(f.name) + " is not an activation format");
        const int64_t n = (int64_t)x.shape(1);
        check_n(f, n);
        const KernelEntry &e = entry(id, isa);
        if (!e.quant_act.fn) throw std::invalid_argument(std::string("no activation quantizer for ") + f.name);
        const size_t rows = x.shape(0), rb = row_bytes(&f, n);
        uint8_t *o;
        auto out = new_array<uint8_t>(rows, rb, &o);
        const float *src = x.data();
        {
            nb::gil_scoped_release nogil;
            for (size_t r = 0; r < rows; ++r) e.quant_act.fn(src + r * (size_t)n, o + r * rb, n);
        }
        count_quant(id, e.quant_act.isa, (int64_t)rows, (int64_t)rows * n);
        return out;
    }, nb::arg("id"), nb::arg("x"), nb::arg("isa") = -1);

    m.def("quantize", [](int id, F32In w) {
        const Format &f = fmt(id);
        const int64_t n = (int64_t)w.shape(1);
        check_n(f, n);
        const KernelEntry &e = kernel_entry(id);
        if (!e.quant_w) throw std::invalid_argument(std::string("lowbit has no quantizer for ") + f.name);
        const size_t rows = w.shape(0);
        uint8_t *o;
        auto out = new_array<uint8_t>(1, rows * row_bytes(&f, n) + tensor_pad(&f), &o);
        const float *src = w.data();
        {
            nb::gil_scoped_release nogil;
            e.quant_w(src, o, (int64_t)rows, n);
        }
        return out;
    }, "Quantize float rows W[rows, n] into one flat tensor of format id (with its pad).");

    // The engine's call: activations already quantized (act[nt, act_row_bytes]), output
    // written into out[nt, rows] for rows [r0, r1) only.
    // repacked: the rows (Q4_K, Q5_K) repacked to the R8 layout first (csrc/repack.h), run by that
    // layout's entry at the level (an error where the level has none, or rows % 8 != 0)
    m.def("matmul_act", [](int id, U8In raw, U8In act, int64_t n, float w_scale, F32Out out,
                           int64_t r0, int64_t r1, int threads, int isa, int path, bool repacked) {
        const Format &f = fmt(id);
        const size_t rb = check_weights(f, raw, n);
        const Format &af = fmt(f.act);
        const size_t arb = row_bytes(&af, n);
        const int64_t rows = (int64_t)raw.shape(0), nt = (int64_t)act.shape(0);
        check_act_out(af, arb, n, act, out, rows);
        if (r0 < 0 || r1 > rows || r0 > r1) throw std::invalid_argument("row range [r0, r1) outside [0, rows)");
        const uint8_t *w = raw.data(), *a = act.data();
        float *o = out.data();
        RepackedBytes r8(nullptr, std::free);
        if (repacked) {
            w = repack_for_bench(f, raw, n, rows, rb, r8, isa);
        }
        // throws here, with the GIL, if the level is not available
        const KernelEntry e = with_path(entry(repacked ? r8_id(id) : id, isa), path);
        const int level = isa < 0 ? cpu_info().selected : isa;
        nb::gil_scoped_release nogil;
        run_rows(f, e, level, w, rb, a, arb, nt, o, (size_t)rows, n, w_scale, r0, r1, threads_or_default(threads));
    }, nb::arg("id"), nb::arg("raw"), nb::arg("act"), nb::arg("n"), nb::arg("w_scale"), nb::arg("out"),
       nb::arg("r0"), nb::arg("r1"), nb::arg("threads") = 0, nb::arg("isa") = -1, nb::arg("path") = 0,
       nb::arg("repacked") = false);
    m.def("has_repacked", [](int id) { return repacked_entry(id) != nullptr; }, nb::arg("id"));
    // Rows of a format with an R8 layout (format id) to it (csrc/repack.h), or (back) R8 rows to the format's
    m.def("repack_r8", [](int id, U8In raw, int64_t n, bool back) {
        const Format &f = fmt(id);
        if (!has_r8_layout(id))
            throw std::invalid_argument(std::string(f.name) + " has no R8 layout (Q4_K, Q5_K, Q4_0, Q4_1, Q8_0 and IQ4_XS have)");
        const size_t rb = check_weights(f, raw, n);
        const int64_t rows = (int64_t)raw.shape(0);
        if (rows % kR8Rows) throw std::invalid_argument("the R8 layout needs a multiple of 8 rows");
        if (!r8_takes(id, n)) throw std::invalid_argument(std::string(f.name) + "'s R8 layout needs rows of a multiple of 64 values");
        uint8_t *p;
        auto res = new_array<uint8_t>((size_t)rows, rb, &p);
        if (!back) repack_r8(id, raw.data(), rb, rows, n, p);
        else for (int64_t r = 0; r < rows; ++r) unpack_r8_row(id, raw.data(), rb, r, n, p + (size_t)r * rb);
        return res;
    }, nb::arg("id"), nb::arg("raw"), nb::arg("n"), nb::arg("back") = false);
    m.def("wide_kernel", [](int id, int isa) -> nb::object {
        if (r8_format(id) == id) fmt(id);  // (else an R8 layout's id)
        const KernelEntry &e = entry(id, isa);
        if (!e.wide.fn) return nb::none();
        return nb::make_tuple(std::string(e.wide.name), std::string(isa_name(e.wide.isa)));
    }, nb::arg("id"), nb::arg("isa") = -1,
       "(wide-window kernel name, level: chunks take 16 tokens at a time through it) or None.");
    m.def("gemm_kernel", [](int id, int isa) -> nb::object {
        if (r8_format(id) == id) fmt(id);  // (else an R8 layout's id)
        const KernelEntry &e = entry(id, isa);
        if (!e.gemm.fn) return nb::none();
        return nb::make_tuple(std::string(e.gemm.name), std::string(isa_name(e.gemm.isa)), e.gemm_min_nt);
    }, nb::arg("id"), nb::arg("isa") = -1,
       "(GEMM kernel name, level, min nt: run_rows uses it for windows >= min nt) or None.");
    m.def("gemm_low", [](int id, int isa) -> nb::object {
        if (r8_format(id) == id) fmt(id);  // (else an R8 layout's id)
        const KernelEntry &e = entry(id, isa);
        if (!e.gemm_low.fn) return nb::none();
        return nb::make_tuple(std::string(e.gemm_low.name), std::string(isa_name(e.gemm_low.isa)), e.gemm_cross);
    }, nb::arg("id"), nb::arg("isa") = -1,
       "(the level below's GEMM, its level, the crossover: chunks of fewer GEMM tokens run it, not "
       "gemm_kernel's) or None.");
    m.def("gemm_tail", [](int id, int isa) -> nb::object {
        fmt(id);
        const KernelEntry &e = entry(id, isa);
        if (!e.gemm.fn) return nb::none();
        return nb::make_tuple(e.gemm_lanes, e.gemm_tail);
    }, nb::arg("id"), nb::arg("isa") = -1,
       "(tokens per GEMM lane vector, the longest tail past whole vectors the windows take) or None.");

    // The fused FFN gate/up: out[nt, rows] = glu(gate . act_t, up . act_t) (run_rows_glu).
    // gate and up: raw rows of formats gid / uid that pair with one activation format; act:
    // x quantized once to it. isa >= 0: that level's row kernels and epilogue.
    // qid >= 0: out also quantized to that activation format by the dispatch (ActOut), returned.
    m.def("matmul_glu", [](int gid, U8In graw, float g_scale, int uid, U8In uraw, float u_scale, U8In act,
                           int64_t n, int kind, F32Out out, int threads, int isa, int qid) -> nb::object {
        const Format &fg = fmt(gid), &fu = fmt(uid);
        const size_t gs = check_weights(fg, graw, n), us = check_weights(fu, uraw, n);
        if (fg.act != fu.act)
            throw std::invalid_argument(std::string("gate (") + fg.name + ") and up (" + fu.name +
                                        ") pair with different activation formats");
        if (graw.shape(0) != uraw.shape(0)) throw std::invalid_argument("gate and up have different row counts");
        if (kind != GLU_SILU && kind != GLU_RELU2 && kind != GLU_GEGLU) throw std::invalid_argument("unknown GLU kind");
        const Format &af = fmt(fg.act);
        const size_t arb = af.id == T_F32 ? (size_t)n * sizeof(float) : row_bytes(&af, n);
        const int64_t rows = (int64_t)graw.shape(0), nt = (int64_t)act.shape(0);
        check_act_out(af, arb, n, act, out, rows);
        const RowMat G{&fg, &entry(gid, isa), graw.data(), gs, g_scale, 1.0f};
        const RowMat U{&fu, &entry(uid, isa), uraw.data(), us, u_scale, 1.0f};
        const GluKernel &glu = glu_at(isa);
        const int level = isa < 0 ? cpu_info().selected : isa;
        const uint8_t *a = act.data();
        float *o = out.data();
        ActOut q{};
        nb::object qarr = nb::none();
        if (qid >= 0) {
            const Format &qf = fmt(qid);
            if (!ActOut::blockwise(qf.id))
                throw std::invalid_argument(std::string(qf.name) + " is not quantized block by block (Q8_0, Q8_1, Q8_K)");
            if (rows % qf.block != 0)
                throw std::invalid_argument(std::string(qf.name) + ": its blocks of " + std::to_string(qf.block) +
                                            " do not divide the " + std::to_string(rows) + " rows");
            const size_t qrb = row_bytes(&qf, rows);
            uint8_t *qp;
            qarr = nb::cast(new_array<uint8_t>((size_t)nt, qrb, &qp));
            q = ActOut{entry(qid, isa).quant_act.fn, qf.block, (size_t)qf.bytes, qp, qrb};
        }
        {
            nb::gil_scoped_release nogil;
            run_rows_glu(G, U, glu, kind, level, a, arb, nt, o, (size_t)rows, n, rows, threads_or_default(threads),
                         q.fn ? &q : nullptr);
        }
        return qarr;
    }, nb::arg("gid"), nb::arg("graw"), nb::arg("g_scale"), nb::arg("uid"), nb::arg("uraw"), nb::arg("u_scale"),
       nb::arg("act"), nb::arg("n"), nb::arg("kind"), nb::arg("out"), nb::arg("threads") = 0, nb::arg("isa") = -1,
       nb::arg("qid") = -1);

    // The GLU epilogue alone: out[i] = act(g[i]) * u[i] over flat float32 arrays.
    m.def("glu", [](nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> g,
                    nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> u,
                    nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cpu> out, int kind, int isa) {
        if (g.shape(0) != u.shape(0) || g.shape(0) != out.shape(0))
            throw std::invalid_argument("glu: g, u and out differ in length");
        if (kind != GLU_SILU && kind != GLU_RELU2 && kind != GLU_SWIGLU_OAI && kind != GLU_GEGLU)
            throw std::invalid_argument("unknown GLU kind");
        const GluKernel &k = glu_at(isa);
        const float *gp = g.data(), *up = u.data();
        float *op = out.data();
        const int64_t n = (int64_t)g.shape(0);
        nb::gil_scoped_release nogil;
        count_glu(kind, k.isa, 0, n);
        (kind == GLU_SWIGLU_OAI ? ref::glu : k.fn)(gp, up, op, n, kind);  // (OAI: the reference only)
    }, nb::arg("g"), nb::arg("u"), nb::arg("out"), nb::arg("kind"), nb::arg("isa") = -1);
    m.def("glu_kernel", [](int isa) {
        const GluKernel &k = glu_at(isa);
        return nb::make_tuple(std::string(k.name), std::string(isa_name(k.isa)));
    }, nb::arg("isa") = -1, "(epilogue name, level) of the GLU epilogue that runs at level isa (-1: selected).");

    // ---- benchmark loops (lowbit bench) ----
    m.def("set_bench_thread_clock", &set_bench_thread_clock, nb::arg("on"),
          "time the bench_* loops with the calling thread's CPU time (one thread) instead of wall time");
    // repacked (bench_rows, bench_matmul): Q4_K / Q5_K rows timed in the R8 layout (repacked once, first)
    m.def("bench_rows", [](int id, U8In raw, U8In act, int64_t n, float w_scale, int threads, int reps, int isa,
                           bool repacked) {
        const Format &f = fmt(id);
        const size_t rb = check_weights(f, raw, n);
        const size_t arb = row_bytes(&fmt(f.act), n);
        const int nt = (int)act.shape(0);
        if ((size_t)act.shape(1) != arb || nt < 1 || nt > MAX_NT) throw std::invalid_argument("bad activations");
        const int64_t rows = (int64_t)raw.shape(0);
        std::vector<float> out((size_t)nt * rows);
        RepackedBytes r8(nullptr, std::free);
        const uint8_t *w = repacked ? repack_for_bench(f, raw, n, rows, rb, r8, isa) : raw.data();
        RowArgs a{w, rb, act.data(), arb, out.data(), (size_t)rows, n, w_scale};
        const KernelEntry &e = entry(repacked ? r8_id(id) : id, isa);
        nb::gil_scoped_release nogil;
        return bench_rows(e, a, rows, nt, threads_or_default(threads), reps);
    }, nb::arg("id"), nb::arg("raw"), nb::arg("act"), nb::arg("n"), nb::arg("w_scale"), nb::arg("threads"),
       nb::arg("reps"), nb::arg("isa") = -1, nb::arg("repacked") = false);
    // the matmul path itself (run_rows: tiles, windows or the GEMM), any nt; path as matmul_act's
    m.def("bench_matmul", [](int id, U8In raw, U8In act, int64_t n, float w_scale, int threads, int reps, int isa,
                             int path, bool repacked) {
        const Format &f = fmt(id);
        const size_t rb = check_weights(f, raw, n);
        const size_t arb = row_bytes(&fmt(f.act), n);
        const int64_t nt = (int64_t)act.shape(0);
        if ((size_t)act.shape(1) != arb || nt < 1) throw std::invalid_argument("bad activations");
        const int64_t rows = (int64_t)raw.shape(0);
        std::vector<float> out((size_t)nt * rows);
        RepackedBytes r8(nullptr, std::free);
        const uint8_t *w = repacked ? repack_for_bench(f, raw, n, rows, rb, r8, isa) : raw.data();
        const KernelEntry e = with_path(entry(repacked ? r8_id(id) : id, isa), path);
        const int level = isa < 0 ? cpu_info().selected : isa;
        nb::gil_scoped_release nogil;
        return bench_matmul(f, e, level, w, rb, act.data(), arb, nt, out.data(), n, w_scale, rows,
                            threads_or_default(threads), reps);
    }, nb::arg("id"), nb::arg("raw"), nb::arg("act"), nb::arg("n"), nb::arg("w_scale"), nb::arg("threads"),
       nb::arg("reps"), nb::arg("isa") = -1, nb::arg("path") = 0, nb::arg("repacked") = false);
    m.def("bench_vec_dot", [](uintptr_t fn, U8In raw, U8In act, int64_t n, int threads, int reps) {
        const int64_t rows = (int64_t)raw.shape(0);
        const int nt = (int)act.shape(0);
        std::vector<float> out((size_t)nt * rows);
        nb::gil_scoped_release nogil;
        return bench_vec_dot(fn, raw.data(), raw.shape(1), act.data(), act.shape(1), out.data(), rows, n, nt,
                             threads_or_default(threads), reps);
    });
    m.def("bench_quant_act", [](int id, F32In x, int reps, int isa) {
        const Format &f = fmt(id);
        const int64_t n = (int64_t)x.shape(1), rows = (int64_t)x.shape(0);
        check_n(f, n);
        const KernelEntry &e = entry(id, isa);
        if (!e.quant_act.fn) throw std::invalid_argument(std::string("no activation quantizer for ") + f.name);
        const size_t rb = row_bytes(&f, n);
        std::vector<uint8_t> out((size_t)rows * rb);
        nb::gil_scoped_release nogil;
        return bench_quant_act(e.quant_act.fn, x.data(), out.data(), rows, n, rb, reps);
    }, nb::arg("id"), nb::arg("x"), nb::arg("reps"), nb::arg("isa") = -1);
    m.def("bench_from_float", [](uintptr_t fn, F32In x, size_t row_bytes, int reps) {
        const int64_t n = (int64_t)x.shape(1), rows = (int64_t)x.shape(0);
        std::vector<uint8_t> out((size_t)rows * row_bytes);
        nb::gil_scoped_release nogil;
        return bench_from_float(fn, x.data(), out.data(), rows, n, row_bytes, reps);
    }, nb::arg("fn"), nb::arg("x"), nb::arg("row_bytes"), nb::arg("reps"));
    m.def("membw", [](U8In buf, int threads, int reps, bool prefetch) {
        uint64_t sink = 0;
        double t;
        {
            nb::gil_scoped_release nogil;
            t = membw(buf.data(), buf.shape(0) * buf.shape(1), threads_or_default(threads), reps, prefetch, &sink);
        }
        return nb::make_tuple(t, sink);
    }, nb::arg("buf"), nb::arg("threads"), nb::arg("reps"), nb::arg("prefetch") = false);

    m.def("bench_peak", [](int isa, int kind, int64_t iters, int threads, int reps) {
        if (!level_available(isa))
            throw std::invalid_argument(std::string("ISA level ") + isa_name(isa) + " is not available here");
        uint64_t macs = 0;
        double t;
        {
            nb::gil_scoped_release nogil;
            t = bench_peak(isa, kind, iters, threads_or_default(threads), reps, &macs);
        }
        return nb::make_tuple(t, macs);
    }, nb::arg("isa"), nb::arg("kind"), nb::arg("iters"), nb::arg("threads"), nb::arg("reps"),
       "(seconds, multiply-adds) of bench peak's loops: kind 0 int8, 1 f32, 2 int8 with int16 sums (avx2), 3 bf16 tiles (amx with AMX-BF16), at level isa.");

    // ---- the engine (src/lowbit/model.py drives it) ----
    nb::class_<Engine>(m, "Engine")
        .def("__init__", [](Engine *e, int n_layer, int dim, int n_head, int n_kv, int head_dim, int ffn, int vocab,
                            int n_ctx, float eps, float rope_base, float rope_scale, int rope_dims, bool rope_neox,
                            bool kv_f16, int n_slots, bool qk_norm_full, int n_expert, int n_expert_used, int expert_ffn,
                            int shexp_ffn, bool expert_norm, float expert_scale, bool sub_norm, int ffn_act,
                            int expert_gating, float yarn_ext_factor, float yarn_attn_factor, float yarn_beta_fast,
                            float yarn_beta_slow, int yarn_orig_ctx,
                            // gemma3 / glm4moe (csrc/engine.h EngineConfig)
                            float embd_scale, float attn_scale, float rope_base_swa, float logit_softcap, float attn_softcap,
                            float attn_temp_scale, int attn_temp_floor, float residual_scale, float logit_scale,
                            bool pre_norms,
                            bool post_norms, int n_dense_lead, bool shexp_gated,
                            // hybrid qwen35 / qwen35moe / qwen3next
                            std::vector<uint8_t> recurrent, int ssm_conv,
                            int ssm_state, int ssm_groups, int ssm_heads, bool ssm_kv_interleave, bool shortconv, bool mamba2, int ssm_inner, bool ssm_parallel, bool mamba1, int ssm_dt_rank, bool ssm_dt_b_c_rms,
                            std::vector<uint8_t> layer_parts, bool ffn_ungated,
                            bool attn_gate,
                            std::vector<int> rope_sections, int layer_begin, int layer_end,
                            // DeepSeek MLA and group-limited routing
                            int mla_rank, int mla_v_dim, int q_lora_rank, float mla_kq_scale, int expert_groups,
                            int expert_groups_used, int kv_k, int kv_v,
                            // gemma4: per-layer attention geometry, V's norm
                            std::vector<int> layer_kv, std::vector<int> layer_hd, int rope_dims_swa, bool v_norm,
                            bool moe_mlp, int ple_dim, std::vector<int> kv_source, std::vector<int> layer_ffn,
                            bool layer_norm, bool parallel_ffn, float logit_mult,
                            int altup, int altup_act, int sparse_layers, float sparse_std_mul, std::vector<uint8_t> moe_layers) {
            EngineConfig c;
            c.n_layer = n_layer; c.dim = dim; c.n_head = n_head; c.n_kv = n_kv; c.head_dim = head_dim; c.ffn = ffn;
            c.vocab = vocab; c.n_ctx = n_ctx; c.eps = eps; c.rope_base = rope_base; c.rope_scale = rope_scale;
            c.rope_dims = rope_dims; c.rope_neox = rope_neox; c.kv_f16 = kv_f16; c.n_slots = n_slots;
            c.qk_norm_full = qk_norm_full; c.n_expert = n_expert; c.n_expert_used = n_expert_used;
            c.expert_ffn = expert_ffn; c.shexp_ffn = shexp_ffn; c.expert_norm = expert_norm;
            c.expert_scale = expert_scale;
            c.sub_norm = sub_norm; c.ffn_act = ffn_act;
            c.expert_gating = expert_gating; c.yarn_ext_factor = yarn_ext_factor; c.yarn_attn_factor = yarn_attn_factor;
            c.yarn_beta_fast = yarn_beta_fast; c.yarn_beta_slow = yarn_beta_slow; c.yarn_orig_ctx = yarn_orig_ctx;
            c.embd_scale = embd_scale; c.attn_scale = attn_scale; c.rope_base_swa = rope_base_swa;
            c.logit_softcap = logit_softcap; c.attn_softcap = attn_softcap; c.attn_temp_scale = attn_temp_scale;
            c.attn_temp_floor = attn_temp_floor; c.residual_scale = residual_scale;
            c.logit_scale = logit_scale; c.pre_norms = pre_norms; c.post_norms = post_norms; c.n_dense_lead = n_dense_lead;
            c.shexp_gated = shexp_gated;
            c.recurrent = std::move(recurrent); c.ssm_conv = ssm_conv; c.ssm_state = ssm_state;
            c.ssm_groups = ssm_groups; c.ssm_heads = ssm_heads; c.ssm_kv_interleave = ssm_kv_interleave;
            c.shortconv = shortconv;
            c.mamba2 = mamba2; c.ssm_inner = ssm_inner; c.ssm_parallel = ssm_parallel;
            c.mamba1 = mamba1; c.ssm_dt_rank = ssm_dt_rank; c.ssm_dt_b_c_rms = ssm_dt_b_c_rms;
            c.layer_parts = std::move(layer_parts); c.ffn_ungated = ffn_ungated;
            c.attn_gate = attn_gate;
            c.kv_k = kv_k; c.kv_v = kv_v;
            if (rope_sections.size() > 4) throw std::invalid_argument("engine: at most 4 rope sections");
            for (size_t i = 0; i < rope_sections.size(); ++i) c.rope_sections[i] = rope_sections[i];
            c.layer_begin = layer_begin; c.layer_end = layer_end;  // a pipeline stage's layers (0, 0: all)
            c.mla_rank = mla_rank; c.mla_v_dim = mla_v_dim; c.q_lora_rank = q_lora_rank;
            c.mla_kq_scale = mla_kq_scale; c.expert_groups = expert_groups; c.expert_groups_used = expert_groups_used;
            c.layer_kv = std::move(layer_kv); c.layer_hd = std::move(layer_hd);
            c.rope_dims_swa = rope_dims_swa; c.v_norm = v_norm; c.moe_mlp = moe_mlp;
            c.ple_dim = ple_dim; c.kv_source = std::move(kv_source); c.layer_ffn = std::move(layer_ffn);
            c.layer_norm = layer_norm; c.parallel_ffn = parallel_ffn; c.logit_mult = logit_mult;
            c.altup = altup; c.altup_act = altup_act; c.sparse_layers = sparse_layers; c.sparse_std_mul = sparse_std_mul;
            c.moe_layers = std::move(moe_layers);
            new (e) Engine(c);
        }, nb::arg("n_layer"), nb::arg("dim"), nb::arg("n_head"), nb::arg("n_kv"), nb::arg("head_dim"),
           nb::arg("ffn"), nb::arg("vocab"), nb::arg("n_ctx"), nb::arg("eps"), nb::arg("rope_base"),
           nb::arg("rope_scale"), nb::arg("rope_dims"), nb::arg("rope_neox"), nb::arg("kv_f16") = true,
           nb::arg("n_slots") = 1, nb::arg("qk_norm_full") = false, nb::arg("n_expert") = 0, nb::arg("n_expert_used") = 0,
           nb::arg("expert_ffn") = 0, nb::arg("shexp_ffn") = 0, nb::arg("expert_norm") = false,
           nb::arg("expert_scale") = 1.0f, nb::arg("sub_norm") = false, nb::arg("ffn_act") = 0,
           nb::arg("expert_gating") = 0, nb::arg("yarn_ext_factor") = 0.0f, nb::arg("yarn_attn_factor") = 1.0f,
           nb::arg("yarn_beta_fast") = 32.0f, nb::arg("yarn_beta_slow") = 1.0f, nb::arg("yarn_orig_ctx") = 0,
           nb::arg("embd_scale") = 0.0f, nb::arg("attn_scale") = 0.0f, nb::arg("rope_base_swa") = 0.0f,
           nb::arg("logit_softcap") = 0.0f, nb::arg("attn_softcap") = 0.0f, nb::arg("attn_temp_scale") = 0.0f, nb::arg("attn_temp_floor") = 0,
           nb::arg("residual_scale") = 0.0f, nb::arg("logit_scale") = 0.0f, nb::arg("pre_norms") = true,
           nb::arg("post_norms") = false, nb::arg("n_dense_lead") = 0,
           nb::arg("shexp_gated") = true,
           nb::arg("recurrent") = std::vector<uint8_t>(), nb::arg("ssm_conv") = 0, nb::arg("ssm_state") = 0,
           nb::arg("ssm_groups") = 0, nb::arg("ssm_heads") = 0, nb::arg("ssm_kv_interleave") = false, nb::arg("shortconv") = false,
           nb::arg("mamba2") = false, nb::arg("ssm_inner") = 0, nb::arg("ssm_parallel") = false,
           nb::arg("mamba1") = false, nb::arg("ssm_dt_rank") = 0, nb::arg("ssm_dt_b_c_rms") = false,
           nb::arg("layer_parts") = std::vector<uint8_t>(), nb::arg("ffn_ungated") = false,
           nb::arg("attn_gate") = false, nb::arg("rope_sections") = std::vector<int>(),
           nb::arg("layer_begin") = 0, nb::arg("layer_end") = 0,
           nb::arg("mla_rank") = 0, nb::arg("mla_v_dim") = 0, nb::arg("q_lora_rank") = 0,
           nb::arg("mla_kq_scale") = 0.0f, nb::arg("expert_groups") = 0, nb::arg("expert_groups_used") = 0,
           nb::arg("kv_k") = (int)T_F16, nb::arg("kv_v") = (int)T_F16,
           nb::arg("layer_kv") = std::vector<int>(), nb::arg("layer_hd") = std::vector<int>(),
           nb::arg("rope_dims_swa") = 0, nb::arg("v_norm") = false, nb::arg("moe_mlp") = false,
           nb::arg("ple_dim") = 0, nb::arg("kv_source") = std::vector<int>(), nb::arg("layer_ffn") = std::vector<int>(),
           nb::arg("layer_norm") = false, nb::arg("parallel_ffn") = false, nb::arg("logit_mult") = 0.0f,
           nb::arg("altup") = 0, nb::arg("altup_act") = 0, nb::arg("sparse_layers") = 0, nb::arg("sparse_std_mul") = 0.0f,
           nb::arg("moe_layers") = std::vector<uint8_t>())
        // The arrays passed to set_mat / set_vec must outlive the engine (model.py keeps them).
        .def("set_mat", [](Engine &e, const std::string &name, int layer, int type, U8In raw, int64_t n, float scale) {
            Mat mt;
            mt.type = type; mt.w = raw.data(); mt.stride = raw.shape(1); mt.rows = (int64_t)raw.shape(0);
            mt.n = n; mt.scale = scale;
            e.set_mat(name, layer, mt);
        })
        .def("set_vec", [](Engine &e, const std::string &name, int layer,
                           nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> v) {
            e.set_vec(name, layer, v.data(), (int64_t)v.shape(0));
        })
        .def("set_window", &Engine::set_window, nb::arg("layer"), nb::arg("window"),
             "Sliding-window attention for a layer: its queries see the last `window` positions (0: all).")
        .def("set_rope", &Engine::set_rope, nb::arg("layer"), nb::arg("on"),
             "Rotary embedding of a layer's q / k on (default) or off (NoPE layers).")
        .def("set_threads", &Engine::set_threads)
        .def("set_prefetch", &Engine::set_prefetch, nb::arg("mode"), "0 off, 1 l1, 2 measure (csrc/prefetch_mode.h)")
        .def_prop_ro("prefetch_measuring", &Engine::prefetch_measuring)
        .def_prop_ro("prefetch_measure_each", [](const Engine &) { return Engine::kMeasureEach; })
        .def_prop_ro("prefetch_measure_skip", [](const Engine &) { return Engine::kMeasureSkip; })
        .def_prop_ro("prefetch_trials", &Engine::prefetch_trials, "(mode, seconds) of each measured forward")
        .def_prop_ro("prefetch_medians", &Engine::prefetch_medians,
                     "(off, l1): the medians of the measured forwards' seconds the choice compared")
        .def("prefetch", &Engine::prefetch)
        // importance matrices (lowbit imatrix): collect on/off, and {weight address: (sums[n_mat, n], counts)}
        .def("collect_acts", &Engine::collect_acts)
        .def("act_sums", [](Engine &e) {
            nb::dict d;
            for (auto &[w, a] : e.act_sums()) {
                const size_t n_mat = a.counts.size();
                double *s;
                auto sums = new_array<double>(n_mat, (size_t)a.n, &s);
                std::memcpy(s, a.sums.data(), a.sums.size() * sizeof(double));
                d[nb::int_((uintptr_t)w)] = nb::make_tuple(sums, nb::cast(a.counts));
            }
            return d;
        })
        .def("clear_act_sums", [](Engine &e) { e.act_sums().clear(); })
        .def("set_stats", &Engine::set_stats)
        .def("set_lookahead", &Engine::set_lookahead)
        .def("lookahead_stats", [](const Engine &e) {
            const Engine::LookaheadStats &s = e.lookahead_stats();
            nb::dict d;
            d["routed"] = s.routed; d["hits"] = s.hits; d["predicted"] = s.predicted;
            return d;
        }, "Router lookahead counters: experts routed (distinct per window and layer >= 1), of them "
           "predicted, experts predicted.")
        .def("reset_lookahead_stats", &Engine::reset_lookahead_stats)
        .def("reset_stats", &Engine::reset_stats)
        .def("stats", [](const Engine &e) {
            std::vector<nb::dict> out;
            for (const LayerStats &s : e.stats()) {
                nb::dict d;
                d["calls"] = s.calls; d["tokens"] = s.tokens; d["distinct_experts"] = s.distinct_experts;
                d["weight_bytes"] = s.weight_bytes; d["t_attn"] = s.t_attn; d["t_router"] = s.t_router;
                d["t_experts"] = s.t_experts; d["t_ffn"] = s.t_ffn;
                d["t_attn_core"] = s.t_attn_core;
                out.push_back(d);
            }
            return out;
        }, "Per-layer counters since reset_stats(): calls, tokens, distinct_experts (summed over calls), "
           "weight_bytes, seconds in attention / router / experts / dense FFN or shared expert.")
        .def("last_routes", [](const Engine &e, int layer) {
            if (layer < 0 || layer >= e.config().n_layer) throw std::invalid_argument("last_routes: no such layer");
            return e.last_routes(layer);
        }, "The experts each token of the last forward call chose at this layer, flat [T * n_expert_used].")
        .def("last_route_margins", [](const Engine &e, int layer) {
            if (layer < 0 || layer >= e.config().n_layer) throw std::invalid_argument("last_route_margins: no such layer");
            return e.last_route_margins(layer);
        }, "Per token of the last forward call: the K-th chosen expert's router probability minus the best "
           "unchosen one's.")
        .def("validate", &Engine::validate)
        .def("forward", [](Engine &e, nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> tokens,
                           int pos, F32Out logits, bool all_logits) {
            const int T = (int)tokens.shape(0);
            const size_t want = all_logits ? (size_t)T : 1;
            if (T < 1) throw std::invalid_argument("forward: need at least one token");
            if ((size_t)logits.shape(0) < want || (int64_t)logits.shape(1) != e.config().vocab)
                throw std::invalid_argument("forward: logits buffer has the wrong shape");
            const int32_t *tk = tokens.data();
            float *lg = logits.data();
            nb::gil_scoped_release nogil;
            e.forward(tk, T, pos, lg, all_logits);
        })
        // tokens, slots, pos: int32[T]; out_rows: int32[n_out]; logits: float32[n_out, vocab]
        .def("forward_batch", [](Engine &e, nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> tokens,
                                 nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> slots,
                                 nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> pos,
                                 nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> out_rows,
                                 F32Out logits) {
            const int T = (int)tokens.shape(0), n_out = (int)out_rows.shape(0);
            if (slots.shape(0) != tokens.shape(0) || pos.shape(0) != tokens.shape(0))
                throw std::invalid_argument("forward_batch: tokens, slots and pos differ in length");
            if ((int64_t)logits.shape(0) != n_out || (int64_t)logits.shape(1) != e.config().vocab)
                throw std::invalid_argument("forward_batch: logits buffer has the wrong shape");
            const int32_t *tk = tokens.data(), *sl = slots.data(), *ps = pos.data(), *rw = out_rows.data();
            float *lg = logits.data();
            nb::gil_scoped_release nogil;
            e.forward_batch(tk, sl, ps, T, rw, n_out, lg);
        })
        // A pipeline stage (csrc/engine.h forward_layers): x_in float32[T, dim] (None in the first
        // stage); the last stage fills logits float32[n_out, vocab], an earlier one x_out [T, dim].
        .def("forward_layers", [](Engine &e, nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> tokens,
                                  nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> slots,
                                  nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> pos,
                                  std::optional<F32In> x_in, std::optional<F32Out> x_out,
                                  nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> out_rows,
                                  std::optional<F32Out> logits) {
            const EngineConfig &c = e.config();
            const int T = (int)tokens.shape(0), n_out = (int)out_rows.shape(0);
            const bool last = e.layer_end() == c.n_layer;
            if (slots.shape(0) != tokens.shape(0) || pos.shape(0) != tokens.shape(0))
                throw std::invalid_argument("forward_layers: tokens, slots and pos differ in length");
            auto rows_of = [&](auto &a, int64_t rows, int64_t cols, const char *what) {
                if ((int64_t)a.shape(0) != rows || (int64_t)a.shape(1) != cols)
                    throw std::invalid_argument(std::string("forward_layers: ") + what + " has the wrong shape");
            };
            if (x_in) rows_of(*x_in, T, c.dim, "x_in");
            if (x_out) rows_of(*x_out, T, c.dim, "x_out");
            if (last && !logits) throw std::invalid_argument("forward_layers: the last stage needs a logits buffer");
            if (last) rows_of(*logits, n_out, c.vocab, "logits");
            const int32_t *tk = tokens.data(), *sl = slots.data(), *ps = pos.data(), *rw = out_rows.data();
            const float *xi = x_in ? x_in->data() : nullptr;
            float *xo = x_out ? x_out->data() : nullptr, *lg = last ? logits->data() : nullptr;
            nb::gil_scoped_release nogil;
            e.forward_layers(tk, sl, ps, T, xi, xo, rw, last ? n_out : 0, lg);
        }, nb::arg("tokens"), nb::arg("slots"), nb::arg("pos"), nb::arg("x_in").none(), nb::arg("x_out").none(),
           nb::arg("out_rows"), nb::arg("logits").none())
        // The MTP blocks' input (csrc/engine.h hidden): rows of the last forward call into out [n, dim].
        .def("hidden", [](const Engine &e, nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> rows,
                          F32Out out) {
            const int n = (int)rows.shape(0);
            if ((int64_t)out.shape(0) != n || (int64_t)out.shape(1) != e.config().dim)
                throw std::invalid_argument("hidden: out must be float32[len(rows), dim]");
            const int32_t *r = rows.data();
            float *o = out.data();
            nb::gil_scoped_release nogil;
            e.hidden(r, n, o);
        }, nb::arg("rows"), nb::arg("out"))
        .def_prop_ro("layer_range", [](const Engine &e) { return nb::make_tuple(e.layer_begin(), e.layer_end()); })
        // The prefix cache: buf (uint8, kv_bytes(n) bytes) <-> KV positions [p0, p0 + n) of a slot.
        .def("set_repack", &Engine::set_repack, nb::arg("on"))
        .def("repacked_sources", [](const Engine &e) {
            std::vector<std::pair<uintptr_t, size_t>> out;
            for (const auto &[p, n] : e.repacked_sources()) out.emplace_back((uintptr_t)p, n);
            return out;
        }, "(address, bytes) of each bound matrix set_mat repacked (its bytes no longer read)")
        .def("kv_bytes", &Engine::kv_bytes)
        .def("commit_slots", [](Engine &e, int n) {
            nb::gil_scoped_release nogil;
            e.commit_slots(n);
        }, nb::arg("n"), "commit the KV cache of slots [0, n) now (Engine::commit_slots)")
        .def_prop_ro("slots_committed", &Engine::slots_committed)
        .def("kv_copy", [](Engine &e, int slot, int p0, int n,
                           nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> buf, bool save) {
            if (n < 0 || (size_t)buf.shape(0) != e.kv_bytes(n))
                throw std::invalid_argument("kv_copy: the buffer must hold kv_bytes(n) bytes");
            uint8_t *p = buf.data();
            nb::gil_scoped_release nogil;
            e.kv_copy(slot, p0, n, p, save);
        }, nb::arg("slot"), nb::arg("p0"), nb::arg("n"), nb::arg("buf"), nb::arg("save"))
        .def_prop_ro("n_slots", [](const Engine &e) { return e.config().n_slots; })
        // Hybrid models: a slot's recurrent state (conv + delta-net, and its position) <-> buf
        .def_prop_ro("hybrid", &Engine::hybrid)
        .def("rstate_bytes", &Engine::rstate_bytes)
        .def("rstate_pos", [](const Engine &e, int slot) {
            if (slot < 0 || slot >= e.config().n_slots) throw std::invalid_argument("rstate_pos: no such slot");
            return e.rstate_pos(slot);
        })
        .def("rstate_copy", [](Engine &e, int slot, nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> buf,
                               bool save) {
            if ((size_t)buf.shape(0) != e.rstate_bytes())
                throw std::invalid_argument("rstate_copy: the buffer must hold rstate_bytes() bytes");
            uint8_t *p = buf.data();
            nb::gil_scoped_release nogil;
            e.rstate_copy(slot, p, save);
        }, nb::arg("slot"), nb::arg("buf"), nb::arg("save"))
        // the replay log (engine.h): (first position, tokens) it holds; fold its first n in
        .def("rstate_log", [](const Engine &e, int slot) {
            if (slot < 0 || slot >= e.config().n_slots) throw std::invalid_argument("rstate_log: no such slot");
            const auto [p0, n] = e.rstate_log(slot);
            return nb::make_tuple(p0, n);
        })
        .def("rstate_replay", [](Engine &e, int slot, int n) {
            nb::gil_scoped_release nogil;
            e.rstate_replay(slot, n);
        }, nb::arg("slot"), nb::arg("n"));

    // ---- lowbit's weight quantizers (csrc/quant/), byte-identical to ggml_quantize_chunk ----
    m.def("quantizer_info", [](int id) {
        fmt(id);
        return nb::make_tuple(quant::has_quantizer(id), quant::needs_imatrix(id), quant::uses_imatrix(id));
    }, "(has a quantizer, needs an importance matrix, reads one) for format id.");
    m.def("quantize_rows", [](int id, F32In w, nb::object imatrix, int threads) {
        const Format &f = fmt(id);
        const int64_t rows = (int64_t)w.shape(0), n = (int64_t)w.shape(1);
        const float *qw = nullptr;
        nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> im;
        if (!imatrix.is_none()) {
            im = nb::cast<nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>>(imatrix);
            if ((int64_t)im.shape(0) != n)
                throw std::invalid_argument("quantize: the importance matrix has " + std::to_string(im.shape(0)) +
                                            " values for rows of " + std::to_string(n));
            qw = im.data();
        }
        if (n <= 0 || n % f.block) check_n(f, n);
        uint8_t *o;
        const size_t rb = row_bytes(&f, n > 0 ? n : 0);
        auto out = new_array<uint8_t>(1, (size_t)rows * rb + tensor_pad(&f), &o);
        const float *src = w.data();
        {
            nb::gil_scoped_release nogil;
            quant::quantize_rows(id, src, o, rows, n, qw, threads);
        }
        return out;
    }, nb::arg("id"), nb::arg("w"), nb::arg("imatrix") = nb::none(), nb::arg("threads") = 0,
       "Quantize float rows W[rows, n] into one flat tensor of format id (with its pad), threaded; "
       "imatrix: n importance weights (one per column) or None.");

    m.def("stats", [] {
        std::vector<nb::tuple> out;
        for (const CallStat &s : call_stats())
            out.push_back(nb::make_tuple(s.type_id, s.nt, s.kernel ? std::string(s.kernel) : std::string("?"),
                                         s.calls, s.rows));
        return out;
    });
    m.def("glu_stats", [] { return op_stat_tuples(glu_stats()); });
    m.def("quant_stats", [] { return op_stat_tuples(quant_stats()); });
    m.def("reset_stats", [] { reset_call_stats(); });
}
