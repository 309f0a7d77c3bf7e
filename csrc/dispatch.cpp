// CPU probes (x86: cpuid + xgetbv; aarch64: getauxval) and the kernel table, filled once at import.
//
// Built WITHOUT ISA flags: nothing here may execute an instruction above the baseline.
// The table starts with the scalar reference entries; each level the CPU supports (up to
// LOWBIT_MAX_ISA) registers into a table of its own, and its entries overwrite the running
// table one by one unless LOWBIT_NO_<KERNEL NAME>=1 turns that kernel off.
#include "dispatch.h"

#include <atomic>
#include <utility>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#elif defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include "ref/ref.h"

namespace lowbit {

// This architecture's levels, lowest to highest (the order every "above" / "below" means).
#if defined(__aarch64__)
static const int kOrder[] = {ISA_SCALAR, ISA_NEON, ISA_DOTPROD, ISA_I8MM};
#else
static const int kOrder[] = {ISA_SCALAR, ISA_AVX, ISA_AVX2, ISA_AVX2VNNI, ISA_AVX512, ISA_AMX};
#endif
constexpr int kOrderLen = (int)(sizeof(kOrder) / sizeof(kOrder[0]));

// The ladder. Each SIMD level's translation units define its register function and are
// built with that level's flags only; a level not compiled into this build is absent here.
struct Level { int isa; void (*reg)(KernelTable &); };
static void register_amx(KernelTable &t);
static const Level kLadder[] = {
    {ISA_SCALAR, register_scalar},
#ifdef LOWBIT_HAVE_AVX
    {ISA_AVX, register_avx},
#endif
#ifdef LOWBIT_HAVE_AVX2
    {ISA_AVX2, register_avx2},
#endif
#ifdef LOWBIT_HAVE_AVX2VNNI
    {ISA_AVX2VNNI, register_avx2vnni},
#endif
#ifdef LOWBIT_HAVE_AVX512
    {ISA_AVX512, register_avx512},
#endif
#ifdef LOWBIT_HAVE_AVX2
    {ISA_AMX, register_amx},  // the hardware's tiles (LOWBIT_HAVE_AMX) or, LOWBIT_AMX=emulate, the emulator's
#endif
#ifdef LOWBIT_HAVE_NEON
    {ISA_NEON, register_neon},
#endif
#ifdef LOWBIT_HAVE_DOTPROD
    {ISA_DOTPROD, register_dotprod},
#endif
#ifdef LOWBIT_HAVE_I8MM
    {ISA_I8MM, register_i8mm},
#endif
};

const char *isa_name(int isa) {
    static const char *names[ISA_COUNT] = {"scalar", "avx2", "avx2vnni", "avx512", "avx", "neon", "dotprod", "i8mm", "amx"};
    return (isa >= 0 && isa < ISA_COUNT) ? names[isa] : "?";
}

int isa_rank(int isa) {
    for (int i = 0; i < kOrderLen; ++i)
        if (kOrder[i] == isa) return i;
    return -1;
}

std::vector<int> isa_ladder() { return std::vector<int>(kOrder, kOrder + kOrderLen); }

int isa_from_name(const std::string &s) {
    for (int i = 0; i < ISA_COUNT; ++i)
        if (s == isa_name(i)) return i;
    return -1;
}

// ---- probes ----------------------------------------------------------------------------
#if defined(__x86_64__) || defined(__i386__)
static uint64_t xgetbv0() {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

static CpuInfo probe() {
    CpuInfo c;
    unsigned a, b, cx, d;
    char brand[49] = {0};
    if ((unsigned)__get_cpuid_max(0x80000000, nullptr) >= 0x80000004u) {  // (int under clang)
        for (unsigned i = 0; i < 3; ++i) {
            __cpuid(0x80000002 + i, a, b, cx, d);
            std::memcpy(brand + 16 * i + 0, &a, 4);
            std::memcpy(brand + 16 * i + 4, &b, 4);
            std::memcpy(brand + 16 * i + 8, &cx, 4);
            std::memcpy(brand + 16 * i + 12, &d, 4);
        }
    }
    c.model = brand;
    while (!c.model.empty() && c.model.front() == ' ') c.model.erase(c.model.begin());

    bool avx = false, fma = false, f16c = false, osxsave = false, avx2 = false, ssse3 = false, sse41 = false;
    bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
    bool avx512vnni = false, avx512vbmi = false, avxvnni = false;
    bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
    if (__get_cpuid(1, &a, &b, &cx, &d)) {
        ssse3 = cx & (1u << 9); sse41 = cx & (1u << 19);
        fma = cx & (1u << 12); osxsave = cx & (1u << 27); avx = cx & (1u << 28); f16c = cx & (1u << 29);
    }
    if (__get_cpuid_max(0, nullptr) >= 7) {
        __cpuid_count(7, 0, a, b, cx, d);
        avx2 = b & (1u << 5); avx512f = b & (1u << 16); avx512dq = b & (1u << 17);
        avx512bw = b & (1u << 30); avx512vl = b & (1u << 31);
        avx512vbmi = cx & (1u << 1); avx512vnni = cx & (1u << 11);
        amx_bf16 = d & (1u << 22); amx_tile = d & (1u << 24); amx_int8 = d & (1u << 25);
        __cpuid_count(7, 1, a, b, cx, d);
        avxvnni = a & (1u << 4);
    }
    // The OS must save the registers: YMM (bits 1,2) for AVX, opmask+ZMM (5,6,7) for AVX-512.
    const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    const bool os_ymm = (xcr0 & 0x6) == 0x6, os_zmm = (xcr0 & 0xe6) == 0xe6;
    avx &= os_ymm; avx2 &= os_ymm; fma &= os_ymm; f16c &= os_ymm; avxvnni &= os_ymm;
    avx512f &= os_zmm; avx512bw &= os_zmm; avx512vl &= os_zmm; avx512dq &= os_zmm;
    avx512vnni &= os_zmm; avx512vbmi &= os_zmm;
    // AMX: the OS enables the tile state (XCR0 bits 17 XTILECFG, 18 XTILEDATA) and, since Linux
    // 5.16, grants it per process on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA): an
    // AMX instruction without the grant faults. Asked once, here; a refusal is recorded.
    const bool os_tiles = (xcr0 & 0x60000) == 0x60000;
    amx_tile &= os_tiles; amx_int8 &= os_tiles; amx_bf16 &= os_tiles;
    c.amx_bf16 = amx_bf16;
    bool amx_granted = false;
    if (amx_tile && amx_int8) {
#if defined(__linux__) && defined(__x86_64__)
        constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
        amx_granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#endif
        if (!amx_granted) c.notes.push_back("amx: the kernel refused the tile state (arch_prctl ARCH_REQ_XCOMP_PERM)");
    }

    auto add = [&](bool on, const char *n) { if (on) c.features.push_back(n); };
    add(avx, "avx"); add(avx2, "avx2"); add(fma, "fma"); add(f16c, "f16c"); add(avxvnni, "avx_vnni");
    add(avx512f, "avx512f"); add(avx512bw, "avx512bw"); add(avx512vl, "avx512vl");
    add(avx512dq, "avx512dq"); add(avx512vnni, "avx512_vnni"); add(avx512vbmi, "avx512_vbmi");
    add(amx_tile, "amx_tile"); add(amx_int8, "amx_int8"); add(amx_bf16, "amx_bf16");

    // avx: 256-bit float, 128-bit integer (SSSE3 / SSE4.1 encoded VEX), no FMA, no F16C.
    const bool l_avx = avx && ssse3 && sse41, l_avx2 = l_avx && avx2 && fma && f16c;
    auto level = [&](bool on, int isa) { if (on) c.runs |= 1u << isa; };
    level(l_avx, ISA_AVX);
    level(l_avx2, ISA_AVX2);
    level(l_avx2 && avxvnni, ISA_AVX2VNNI);  // not implied by AVX-512 (Zen 4 has AVX512-VNNI only)
    const bool l_avx512 = l_avx2 && avx512f && avx512bw && avx512vl && avx512dq && avx512vnni;
    level(l_avx512, ISA_AVX512);
#if defined(LOWBIT_HAVE_AMX)
    level(l_avx512 && amx_tile && amx_int8 && amx_granted, ISA_AMX);
#endif
    // LOWBIT_AMX=emulate: the amx level's GEMMs on the emulator (csrc/x86/amx_tiles.h), above the
    // CPU's own levels, on any CPU with avx2 (tests of the amx code where no CPU has AMX)
    if (const char *e = std::getenv("LOWBIT_AMX"); e && *e) {
        if (std::strcmp(e, "emulate") != 0)
            throw std::invalid_argument(std::string("LOWBIT_AMX=") + e + " is not 'emulate' (the only setting)");
        c.amx_emulated = l_avx2;
        if (l_avx2) c.runs |= 1u << ISA_AMX, c.notes.push_back("amx: emulated (LOWBIT_AMX=emulate), not the CPU's");
    }
    return c;
}
#elif defined(__aarch64__)
// Linux reports the CPU's features in the auxiliary vector (the kernel read the ID registers):
// no instruction of a level runs here. Bits from <asm/hwcap.h>, spelled out so that an old
// libc's headers do not matter.
static CpuInfo probe() {
    constexpr unsigned long kAsimd = 1ul << 1, kAsimdDp = 1ul << 20;  // AT_HWCAP
    constexpr unsigned long kI8mm = 1ul << 13;                        // AT_HWCAP2
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    CpuInfo c;
    c.model = "aarch64";
    const bool asimd = hw & kAsimd, dotprod = hw & kAsimdDp, i8mm = hw2 & kI8mm;
    if (asimd) c.features.push_back("asimd");
    if (dotprod) c.features.push_back("asimddp");
    if (i8mm) c.features.push_back("i8mm");
    if (asimd) c.runs |= 1u << ISA_NEON;
    if (asimd && dotprod) c.runs |= 1u << ISA_DOTPROD;
    if (asimd && dotprod && i8mm) c.runs |= 1u << ISA_I8MM;
    return c;
}
#else
static CpuInfo probe() { CpuInfo c; c.model = "unknown architecture"; return c; }
#endif

// ---- the table ---------------------------------------------------------------------------
// g_levels[l]: what runs with LOWBIT_MAX_ISA=l (levels <= l overlaid in order); filled for
// every level this CPU can run and this build has, so tests can compare levels in one
// process. The dispatch table is g_levels[selected].
static KernelTable g_levels[ISA_COUNT];
static bool g_level_ready[ISA_COUNT];  // CPU, cap and build allow it (may alias a lower level)
static bool g_level_built[ISA_COUNT];  // this level has kernels of its own in this build
static CpuInfo g_cpu;
static std::vector<std::string> g_disabled;

static bool env_disables(const char *kernel_name) {
    std::string key = "LOWBIT_NO_";
    for (const char *p = kernel_name; *p; ++p) key += (char)std::toupper((unsigned char)*p);
    const char *v = std::getenv(key.c_str());
    return v && *v && std::strcmp(v, "0") != 0;
}

// A SIMD kernel (row kernel, GEMM, quantizer, attention, GLU) that LOWBIT_NO_<NAME>=1 turns off; the
// reference (scalar) level is never turned off. Records the name for cpu_info()["disabled"].
static bool turned_off(const char *name, int isa) {
    if (isa == ISA_SCALAR || !name || !env_disables(name)) return false;
    bool seen = false;
    for (auto &d : g_disabled) seen |= d == name;
    if (!seen) g_disabled.push_back(name);
    return true;
}

// A level's kernel in a slot replaces the level below's, unless LOWBIT_NO_<NAME>=1 turns it off.
template <class Fn>
static void take(KernelSlot<Fn> &running, const KernelSlot<Fn> &level) {
    if (level.fn && !turned_off(level.name, level.isa)) running = level;
}

// Overwrite `dst` with what `src` (one level's registrations) provides, kernel by kernel.
static void overlay(KernelEntry &dst, const KernelEntry &src) {
    for (int nt = 1; nt <= MAX_NT; ++nt) take(dst.rows[nt], src.rows[nt]);
    // A level's GEMM replaces a lower level's (or, if turned off, removes it: it would pair
    // with this level's row kernels otherwise).
    // LOWBIT_NO_GEMM=1 removes every GEMM (the window kernels take every chunk).
    // A level with GEMMs only (amx, but for BF16) turned off keeps the level below's GEMM (whose windows stay).
    if (src.gemm.fn) {
        const bool off = turned_off("gemm", src.gemm.isa) || turned_off(src.gemm.name, src.gemm.isa);
        if (!off) {
            // a crossover (the amx level) keeps the level below's GEMM for the chunks below it, when
            // that GEMM is there and its lanes are this one's (so the tails the windows take agree)
            const bool low = src.gemm_cross > src.gemm_min_nt && src.gemm_min_nt > 0 && dst.gemm.fn &&
                             dst.gemm_min_nt > 0 && dst.gemm_lanes == src.gemm_lanes;
            dst.gemm_low = low ? dst.gemm : RowKernel{}, dst.gemm_cross = low ? src.gemm_cross : 0;
            dst.gemm = src.gemm, dst.gemm_min_nt = src.gemm_min_nt;
            dst.gemm_lanes = src.gemm_lanes, dst.gemm_tail = src.gemm_tail, dst.gemm_rows = src.gemm_rows;
        } else if (src.rows[1].fn) {
            dst.gemm = dst.gemm_low = RowKernel{}, dst.gemm_min_nt = dst.gemm_cross = 0;
            dst.gemm_lanes = src.gemm_lanes, dst.gemm_tail = src.gemm_tail, dst.gemm_rows = 1;
        }
    }
    // The wide window likewise; LOWBIT_NO_WIDE=1 removes every one (windows of <= 8 instead).
    if (src.wide.fn) {
        const bool off = turned_off("wide", src.wide.isa) || turned_off(src.wide.name, src.wide.isa);
        dst.wide = off ? RowKernel{} : src.wide;
    }
    if (src.dequant) dst.dequant = src.dequant;
    take(dst.quant_act, src.quant_act);
    if (src.quant_w) dst.quant_w = src.quant_w;
    if (src.count_id >= 0) dst.count_id = src.count_id;
}

static bool cpu_runs(int isa) { return (g_cpu.runs >> isa) & 1u; }

static void fill_table() {
    g_cpu = probe();
    for (int i = 0; i < kOrderLen; ++i)
        if (cpu_runs(kOrder[i])) g_cpu.best = kOrder[i];
    g_cpu.cap = kOrder[kOrderLen - 1];
    for (const Level &l : kLadder) g_cpu.built = isa_rank(l.isa) > isa_rank(g_cpu.built) ? l.isa : g_cpu.built;
    if (const char *cap = std::getenv("LOWBIT_MAX_ISA"); cap && *cap) {
        const int c = isa_from_name(cap);
        if (c < 0 || isa_rank(c) < 0) {
            std::string names;
            for (int i = 0; i < kOrderLen; ++i) names += std::string(i ? ", " : "") + isa_name(kOrder[i]);
            throw std::invalid_argument(std::string("LOWBIT_MAX_ISA=") + cap + " is not one of " + names +
                                        " (the levels of this CPU architecture)");
        }
        g_cpu.cap = c;
    }
    const int cap = isa_rank(g_cpu.cap);
    static KernelTable running, level;  // big: keep them off the stack
    for (const Level &l : kLadder) {
        const int rk = isa_rank(l.isa);
        if (!cpu_runs(l.isa) || rk > cap) continue;  // I6: nothing the CPU lacks or above the cap runs
        level = KernelTable{};
        l.reg(level);
        for (int id = 0; id < 64; ++id) overlay(running.e[id], level.e[id]);
        overlay(running.i8s, level.i8s);
        for (int i = 0; i < kR8Layouts; ++i) overlay(running.r8[i], level.r8[i]);
        // LOWBIT_NO_ATTN_F16_<LEVEL>=1 / LOWBIT_NO_GLU_<LEVEL>=1: keep the level below's
        take(running.attn, level.attn);
        take(running.mla, level.mla);
        take(running.attnq, level.attnq);
        take(running.attnq_rows, level.attnq_rows);
        take(running.glu, level.glu);
        take(running.delta, level.delta);
        take(running.scan, level.scan);
        // a level the ladder skips (not built) runs what the level below it runs
        for (int i = rk; i < kOrderLen; ++i) {
            g_levels[kOrder[i]] = running;
            g_level_ready[kOrder[i]] = cpu_runs(kOrder[i]) && i <= cap;
        }
        bool own = false;  // a level whose register function adds nothing is not "built"
        for (int id = 0; id < 64; ++id)
            for (int nt = 1; nt <= MAX_NT; ++nt) own |= level.e[id].rows[nt].fn != nullptr;
        for (int nt = 1; nt <= MAX_NT; ++nt) own |= level.i8s.rows[nt].fn != nullptr;
        for (int id = 0; id < 64; ++id) own |= level.e[id].gemm.fn != nullptr;  // (amx: GEMMs, and BF16's tile rows)
        own |= l.isa == ISA_SCALAR;
        g_level_built[l.isa] = own;
        g_cpu.selected = l.isa;
    }
}

static std::once_flag g_once;
bool iq_grid_by_loads() {
    static const bool v = [] {
        if (const char *e = std::getenv("LOWBIT_IQ_GRID"); e && *e) return std::strcmp(e, "gather") != 0;
#if defined(__x86_64__) || defined(__i386__)
        unsigned a, b, c, d;
        if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
        char vendor[13] = {0};
        std::memcpy(vendor, &b, 4); std::memcpy(vendor + 4, &d, 4); std::memcpy(vendor + 8, &c, 4);
        return std::strcmp(vendor, "AuthenticAMD") == 0 || std::strcmp(vendor, "HygonGenuine") == 0;
#else
        return true;
#endif
    }();
    return v;
}

static void ensure_table() { std::call_once(g_once, fill_table); }

const CpuInfo &cpu_info() { ensure_table(); return g_cpu; }
const std::vector<std::string> &disabled_kernels() { ensure_table(); return g_disabled; }

const KernelEntry &kernel_entry(int type_id) { return kernel_entry_at(type_id, cpu_info().selected); }

const KernelEntry &kernel_entry_at(int type_id, int isa) {
    ensure_table();
    static const KernelEntry empty{};
    if (isa < 0 || isa >= ISA_COUNT || !g_level_ready[isa]) return empty;
    if (type_id != T_I8_S && r8_format(type_id) == type_id && (type_id < 0 || type_id >= 64)) return empty;
    return g_levels[isa].at(type_id);
}

const KernelEntry *repacked_entry(int type_id) {
    static const bool off = [] { const char *e = std::getenv("LOWBIT_NO_REPACK"); return e && *e && *e != '0'; }();
    if (r8_id(type_id) < 0 || off) return nullptr;
    const KernelEntry &e = kernel_entry_at(r8_id(type_id), cpu_info().selected);
    return e.rows[1].fn ? &e : nullptr;
}

bool level_available(int isa) { ensure_table(); return isa >= 0 && isa < ISA_COUNT && g_level_ready[isa]; }
const KernelTable &kernel_table(int isa) {
    ensure_table();
    static const KernelTable none{};  // every fn null
    if (isa < 0) return g_levels[g_cpu.selected];
    return level_available(isa) ? g_levels[isa] : none;
}

bool level_built(int isa) { ensure_table(); return isa >= 0 && isa < ISA_COUNT && g_level_built[isa]; }

// The amx level: the emulator's GEMMs under LOWBIT_AMX=emulate, else the hardware's
static void register_amx(KernelTable &t) {
    if (g_cpu.amx_emulated) return amx_emu::register_gemm(t), amx_emu::register_bf16(t);
#ifdef LOWBIT_HAVE_AMX
    register_amx_hw(t, g_cpu.amx_bf16);
#endif
}

void register_scalar(KernelTable &t) {
    t.attn = AttnKernel{ref::attend_f16, "attn_f16_scalar", ISA_SCALAR};
    t.mla = MlaKernel{ref::mla_f16, "mla_f16_scalar", ISA_SCALAR};
    t.attnq = AttnQKernel{ref::attend_q, "attn_q_scalar", ISA_SCALAR};
    t.attnq_rows = AttnQRowsKernel{attn_q_rows_by_row<ref::attend_q>, "attn_q_rows_scalar", ISA_SCALAR};
    t.delta = DeltaKernel{ref::delta_rule, "delta_scalar", ISA_SCALAR};
    t.scan = ScanKernel{ref::ssm_scan, "scan_scalar", ISA_SCALAR};
    ref::register_float(t);
    ref::register_act(t);
    ref::register_legacy(t);
    ref::register_kquants(t);
    ref::register_iquants(t);
    ref::register_ternary(t);
    ref::register_mxfp4(t);
    ref::register_glu(t);
}

// ---- call counters -----------------------------------------------------------------------
// Relaxed atomics: counters, not synchronisation. One Counter per (what, level):
//   row kernels [slot][nt][level] (slot 64 is I8_S; nt 0: the GEMM), GLU epilogue [kind][level],
//   activation quantizers [slot][level].
struct Counter {
    std::atomic<long long> calls{0}, rows{0}, values{0};
    void add(int64_t r, int64_t v) {
        calls.fetch_add(1, std::memory_order_relaxed);
        rows.fetch_add(r, std::memory_order_relaxed);
        values.fetch_add(v, std::memory_order_relaxed);
    }
    long long n() const { return calls.load(std::memory_order_relaxed); }
    void reset() { calls = 0, rows = 0, values = 0; }
};
// g_rows_ctr[slot][nt]: nt 0 the GEMM, 1..MAX_NT the windows, MAX_NT + 1 the wide window
constexpr int kSlots = 65 + kR8Layouts;
static Counter g_rows_ctr[kSlots][MAX_NT + 2][ISA_COUNT], g_glu_ctr[4][ISA_COUNT], g_quant_ctr[kSlots][ISA_COUNT];
// counter slots: format ids 0..63, then I8_S, then the R8 layouts (kR8FirstId, ...)
static int slot_of(int id) {
    return id == T_I8_S ? 64 : is_r8_id(id) ? 65 + (id - kR8FirstId) : (id >= 0 && id < 64 ? id : -1);
}
static int id_of(int slot) { return slot == 64 ? T_I8_S : slot >= 65 ? kR8FirstId + (slot - 65) : slot; }

void count_call(int type_id, int nt, int isa, int64_t rows) {
    const int s = slot_of(type_id);
    if (nt == WIDE_NT) nt = MAX_NT + 1;
    if (s < 0 || nt < 0 || nt > MAX_NT + 1 || isa < 0 || isa >= ISA_COUNT) return;
    g_rows_ctr[s][nt][isa].add(rows, 0);
}
void count_glu(int kind, int isa, int64_t rows, int64_t values) {
    if (kind < 0 || kind > 3 || isa < 0 || isa >= ISA_COUNT) return;
    g_glu_ctr[kind][isa].add(rows, values);
}
void count_quant(int type_id, int isa, int64_t rows, int64_t values) {
    const int s = slot_of(type_id);
    if (s < 0 || isa < 0 || isa >= ISA_COUNT) return;
    g_quant_ctr[s][isa].add(rows, values);
}

std::vector<CallStat> call_stats() {
    std::vector<CallStat> out;
    for (int s = 0; s < kSlots; ++s)
        for (int k = 0; k <= MAX_NT + 1; ++k)
            for (int l = 0; l < ISA_COUNT; ++l)
                if (const Counter &c = g_rows_ctr[s][k][l]; c.n()) {
                    const KernelEntry &e = kernel_entry_at(id_of(s), l);
                    const int nt = k > MAX_NT ? WIDE_NT : k;
                    // (a repacked layout's calls are reported under its format: its kernels' names say which)
                    const int id = r8_format(id_of(s));
                    out.push_back({id, nt, nt ? window_kernel(e, nt).name : e.gemm.name, c.n(), c.rows.load()});
                }
    return out;
}
// The non-zero counters of ctr[i][level] as OpStats; key_name(i, level) -> {key, kernel name}.
template <size_t N, class KeyName>
static std::vector<OpStat> op_stats(const Counter (&ctr)[N][ISA_COUNT], KeyName key_name) {
    std::vector<OpStat> out;
    for (size_t i = 0; i < N; ++i)
        for (int l = 0; l < ISA_COUNT; ++l)
            if (const Counter &c = ctr[i][l]; c.n()) {
                const auto [key, name] = key_name((int)i, l);
                out.push_back({key, name, c.n(), c.rows.load(), c.values.load()});
            }
    return out;
}
std::vector<OpStat> glu_stats() {
    return op_stats(g_glu_ctr, [](int k, int l) { return std::pair<int, const char *>{k, kernel_table(l).glu.name}; });
}
std::vector<OpStat> quant_stats() {
    return op_stats(g_quant_ctr, [](int s, int l) {
        return std::pair<int, const char *>{id_of(s), kernel_entry_at(id_of(s), l).quant_act.name};
    });
}

void reset_call_stats() {
    for (auto &a : g_rows_ctr) for (auto &b : a) for (auto &c : b) c.reset();
    for (auto &a : g_glu_ctr) for (auto &c : a) c.reset();
    for (auto &a : g_quant_ctr) for (auto &c : a) c.reset();
}

}  // namespace lowbit
