// The neon level's attention over a quantized KV cache: csrc/arm/attn_q.inl built with this level's flags only.
#define LOWBIT_ISA ISA_NEON
#define LOWBIT_NS neon
#include "../attn_q.inl"
