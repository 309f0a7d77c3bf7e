// The attention over a quantized KV cache at the avx2vnni level: csrc/x86/attn_q.inl with AVX-VNNI
// (its shared-rows kernel's scores with keys in lanes, one vpdpbusd per 4 codes of 8 keys).
#define LOWBIT_ISA ISA_AVX2VNNI
#define LOWBIT_NS avx2vnni
#include "../attn_q.inl"
