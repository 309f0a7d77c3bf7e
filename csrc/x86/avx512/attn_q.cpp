// The attention over a quantized KV cache at the avx512 level: csrc/x86/attn_q.inl.
#define LOWBIT_ISA ISA_AVX512
#define LOWBIT_NS avx512
#include "../attn_q.inl"
