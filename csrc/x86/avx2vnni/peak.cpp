// bench peak's multiply-add loops at the avx2vnni level: csrc/x86/peak.inl.
#define LOWBIT_NS avx2vnni
#include "../peak.inl"
