// The row kernels' weight prefetch mode (csrc/x86/prefetch.h has the two ways and why): one
// process-wide value, set by Engine::forward_layers from its model's choice (Engine::set_prefetch;
// lowbit.model's _prefetch_plan: measured for a model whose weights exceed the L3 cache, else l1,
// LOWBIT_PREFETCH overriding). Read once per prefetch: a stale value (two
// engines in one process) costs speed, never a result.
#pragma once

namespace lowbit {

enum PrefetchMode : int { kPrefetchOff = 0, kPrefetchL1 = 1 };
// Engine::set_prefetch's third choice: measure off against l1 on the model's own forwards (never
// a value of g_prefetch_mode)
constexpr int kPrefetchMeasure = 2;
// (a plain int: an atomic load in the kernels' loops made row kernels spill, I7; it is written
// before the engine's dispatches, which order it before the workers' reads)
inline int g_prefetch_mode = kPrefetchL1;

}  // namespace lowbit
