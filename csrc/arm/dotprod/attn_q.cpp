// The dotprod level's attention over a quantized KV cache: csrc/arm/attn_q.inl built with this level's flags only.
#define LOWBIT_ISA ISA_DOTPROD
#define LOWBIT_NS dotprod
#include "../attn_q.inl"
