// CPU probes and the once-filled kernel table. Built with NO ISA flags.
#pragma once
#include <string>
#include <vector>

#include "kernels.h"

namespace lowbit {

struct CpuInfo {
    std::string model;                  // brand string from cpuid (aarch64: "aarch64")
    std::vector<std::string> features;  // the ones lowbit's levels care about
    unsigned runs = 1u << ISA_SCALAR;   // bit isa: this CPU can run that level (not a ladder
                                        // prefix: an AVX-512 Zen 4 has no AVX-VNNI for avx2vnni)
    int best = ISA_SCALAR;              // highest level this CPU can run
    int built = ISA_SCALAR;             // highest level compiled into this build
    int cap = ISA_SCALAR;               // LOWBIT_MAX_ISA (or this architecture's top level)
    int selected = ISA_SCALAR;          // min(best, built-ladder, cap): what dispatch used
    bool amx_emulated = false;          // LOWBIT_AMX=emulate: the amx level runs on the emulator
    bool amx_bf16 = false;              // AMX-BF16 usable (the amx level then runs BF16 on tiles)
    std::vector<std::string> notes;     // what the probe could not use and why (an AMX grant refused)
};

const CpuInfo &cpu_info();
// What runs at level isa (as if LOWBIT_MAX_ISA=isa); an empty entry if this CPU cannot
// run that level. Tests use it to compare every level in one process.
const KernelEntry &kernel_entry_at(int type_id, int isa);
bool level_available(int isa);
bool level_built(int isa);  // available and with kernels of its own (not an alias of a lower one)
// Parse a level name ("scalar", "avx", "avx2", ..., "neon", "dotprod", "i8mm"); -1 if unknown.
int isa_from_name(const std::string &s);
// This build's architecture's levels, lowest to highest (ids; isa_rank is the position).
std::vector<int> isa_ladder();
// The kernels that were turned off by LOWBIT_NO_<KERNEL>=1 at import.
const std::vector<std::string> &disabled_kernels();

struct CallStat { int type_id; int nt; const char *kernel; long long calls; long long rows; };
std::vector<CallStat> call_stats();
// Calls of the GLU epilogue per (kind, level) and of the activation quantizers per
// (activation type id, level): key = the kind or the type id; GLU rows = gate rows summed,
// values = rows * tokens; quantizers rows = tokens, values = tokens * n.
struct OpStat { int key; const char *kernel; long long calls; long long rows; long long values; };
std::vector<OpStat> glu_stats();
std::vector<OpStat> quant_stats();
void reset_call_stats();  // the row-kernel, GLU and quantizer counters

}  // namespace lowbit
