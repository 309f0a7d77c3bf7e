// bench peak's multiply-add loops at the avx512 level: csrc/x86/peak.inl.
#define LOWBIT_NS avx512
#include "../peak.inl"
