// The avx2 GEMMs' inner loop alone (csrc/x86/gemm.inl, vdots16: a broadcast weight dword, vpmaddubsw
// against R x V activation vectors, int16 sums by vpaddw, a vpmaddwd every 8 dwords), registers only,
// operands in L1: GMAC/s of one thread per R rows x V lane vectors of 8 tokens. The measurement behind
// the avx2 k-quant and legacy GEMMs' passes of 2 vectors x 4 rows (BENCHMARKS.md round (22)).
//
//   g++ -O2 -mavx2 -mfma -o /tmp/presum_loop tools/bench_presum_loop.cpp && taskset -c 1 /tmp/presum_loop
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
// R rows x V vectors presum loop: per dword: V act loads, R bcast loads, R*V maddubs + addw
template <int R, int V>
__attribute__((noinline)) void kern(const uint8_t* w, const uint8_t* a, int ndw, int wstride, __m256i* out) {
    __m256i p[R][V];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) _Pragma("GCC unroll 16") for (int v = 0; v < V; ++v) p[r][v] = _mm256_setzero_si256();
    __m256i acc[R][V];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) _Pragma("GCC unroll 16") for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_si256();
    for (int g0 = 0; g0 < ndw; g0 += 8) {
        #pragma GCC unroll 8
        for (int g = g0; g < g0 + 8; ++g) {
            __m256i av[V];
            _Pragma("GCC unroll 16") for (int v = 0; v < V; ++v) { av[v] = _mm256_load_si256((const __m256i*)(a + (size_t)v * ndw * 32 + (size_t)g * 32)); __asm__("" : "+v"(av[v])); }
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
                int32_t x; std::memcpy(&x, w + (size_t)r * wstride + 4 * g, 4);
                __m256i ww = _mm256_set1_epi32(x);
                _Pragma("GCC unroll 16") for (int v = 0; v < V; ++v) { __m256i t = _mm256_add_epi16(p[r][v], _mm256_maddubs_epi16(ww, av[v])); __asm__("" : "+v"(t)); p[r][v] = t; }
            }
        }
        _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) _Pragma("GCC unroll 16") for (int v = 0; v < V; ++v) { acc[r][v] = _mm256_add_epi32(acc[r][v], _mm256_madd_epi16(p[r][v], _mm256_set1_epi16(3))); p[r][v] = _mm256_setzero_si256(); }
    }
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) _Pragma("GCC unroll 16") for (int v = 0; v < V; ++v) out[r * V + v] = acc[r][v];
}
template <int R, int V> void run(int ndw, const char* tag) {
    std::vector<uint8_t> w(R * ndw * 4 + 64, 3), a(V * ndw * 32 + 64, 5);
    uint8_t* ap = (uint8_t*)(((uintptr_t)a.data() + 31) & ~31);
    __m256i out[R * V];
    double best = 1e9;
    for (int rep = 0; rep < 30; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 200; ++i) kern<R, V>(w.data(), ap, ndw, ndw * 4, out);
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (dt < best) best = dt;
    }
    double macs = 200.0 * ndw * 4 * 8 * R * V;
    printf("%s R=%d V=%d ndw=%d: %.1f GMAC/s\n", tag, R, V, ndw, macs / best / 1e9);
}
int main() {
    for (int ndw : {256, 1024}) {
        run<3, 1>(ndw, ""); run<4, 2>(ndw, ""); run<5, 2>(ndw, ""); run<6, 2>(ndw, ""); run<2, 3>(ndw, ""); run<3, 3>(ndw, ""); run<4, 3>(ndw, ""); run<2, 4>(ndw, ""); run<3, 4>(ndw, "");
    }
}
