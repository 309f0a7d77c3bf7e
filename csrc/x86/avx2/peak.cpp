// bench peak's multiply-add loops at the avx2 level: csrc/x86/peak.inl.
#define LOWBIT_NS avx2
#include "../peak.inl"
