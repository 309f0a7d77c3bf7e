// Per-token code unrolled at compile time, for the kernels that keep one vector (or a few) per
// token of a pass in registers (I7): LB_TOKENS(NT, body) runs body once for each t = 0 .. NT-1
// with t a constant, so arrays indexed by t stay in registers (indexed by a loop counter, GCC
// places them in memory before unrolling the loop). Used by csrc/x86/avx512/kq_r8.cpp and
// lg_r8.cpp. Header only; no ISA flags of its own.
#pragma once
#include <utility>

namespace lowbit {

// f(integral_constant<int, t>) for t = 0 .. NT-1
template <class F, int... T>
inline __attribute__((always_inline)) void each_token(F &&f, std::integer_sequence<int, T...>) {
    (f(std::integral_constant<int, T>{}), ...);
}

}  // namespace lowbit

#define LB_TOKENS(NT, ...)                                                                                  \
    ::lowbit::each_token([&](auto tc) __attribute__((always_inline)) { constexpr int t = decltype(tc)::value; \
                                                                       __VA_ARGS__;                         \
                                                                     },                                      \
                         std::make_integer_sequence<int, NT>{})
