"""The tools CI relies on can fail: check_spills finds a real spill, and passes clean code."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SPILLY = r"""
#include <immintrin.h>
void opaque(void);
// Eight live accumulators across an opaque call: the ABI makes every ymm caller-saved,
// so the compiler must spill them to the stack.
__m256 rows_spilly(const float *p, int n) {
    __m256 a0 = _mm256_loadu_ps(p), a1 = _mm256_loadu_ps(p + 8), a2 = _mm256_loadu_ps(p + 16),
           a3 = _mm256_loadu_ps(p + 24);
    for (int i = 0; i < n; ++i) {
        opaque();
        a0 = _mm256_add_ps(a0, a1); a1 = _mm256_add_ps(a1, a2); a2 = _mm256_add_ps(a2, a3);
        a3 = _mm256_add_ps(a3, a0);
    }
    return _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
}
__m256 rows_clean(const float *p, int n) {
    __m256 a0 = _mm256_setzero_ps();
    for (int i = 0; i < n; ++i) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + 8 * i));
    return a0;
}
"""


def run_check(build):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "check_spills.py"), str(build)],
                          capture_output=True, text=True)


def test_check_spills_finds_a_spill_and_passes_clean_code(tmp_path):
    d = tmp_path / "CMakeFiles" / "lowbit_avx2.dir"
    d.mkdir(parents=True)
    src = tmp_path / "k.cpp"
    src.write_text(SPILLY)
    subprocess.run(["g++", "-O2", "-mavx2", "-c", str(src), "-o", str(d / "k.o")], check=True)
    r = run_check(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "rows_spilly" in r.stdout and "rows_clean" not in r.stdout
    src.write_text(SPILLY.split("__m256 rows_spilly")[0] + "__m256 rows_clean" + SPILLY.split("__m256 rows_clean")[1])
    subprocess.run(["g++", "-O2", "-mavx2", "-c", str(src), "-o", str(d / "k.o")], check=True)
    r = run_check(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


RBP_AS_REGISTER = r"""
#include <immintrin.h>
// %rbp as a general register (clang does this): a vector load at (%rbp) is not a stack access.
__m256 rows_rbp_register(const float *p) {
    __m256 r;
    __asm__("push %%rbp\n\tmov %1, %%rbp\n\tvmovups (%%rbp), %0\n\tpop %%rbp" : "=x"(r) : "r"(p));
    return r;
}
"""


def test_check_spills_names_the_compiler_and_reads_rbp_as_a_register_without_a_frame(tmp_path):
    d = tmp_path / "CMakeFiles" / "lowbit_avx2.dir"
    d.mkdir(parents=True)
    (tmp_path / "CMakeCache.txt").write_text("CMAKE_CXX_COMPILER:FILEPATH=/usr/bin/g++\n")
    src = tmp_path / "k.cpp"
    src.write_text(RBP_AS_REGISTER)
    subprocess.run(["g++", "-O2", "-mavx2", "-fomit-frame-pointer", "-c", str(src), "-o", str(d / "k.o")], check=True)
    r = run_check(tmp_path)
    assert f"# {tmp_path}: built by /usr/bin/g++" in r.stdout, r.stdout
    assert r.returncode == 0 and "rows_rbp_register" not in r.stdout, r.stdout + r.stderr
