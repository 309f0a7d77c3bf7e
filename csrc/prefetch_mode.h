// The row kernels' weight prefetch mode (csrc/x86/prefetch.h has the two ways and why): one
// process-wide value, set by Engine::forward_layers from its model's choice (Engine::set_prefetch;
// lowbit.model's _prefetch_plan: l2 for a model whose weights exceed the L3 cache, else l1,
// LOWBIT_PREFETCH overriding). Read with a relaxed load per kernel call: a stale value (two
// engines in one process) costs speed, never a result.
#pragma once
#include <atomic>

namespace lowbit {

enum PrefetchMode : int { kPrefetchOff = 0, kPrefetchL1 = 1, kPrefetchL2 = 2 };
inline std::atomic<int> g_prefetch_mode{kPrefetchL1};

}  // namespace lowbit
