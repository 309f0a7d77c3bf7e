// The attention over a quantized KV cache at the avx2 level: csrc/x86/attn_q.inl.
#define LOWBIT_ISA ISA_AVX2
#define LOWBIT_NS avx2
#include "../attn_q.inl"
