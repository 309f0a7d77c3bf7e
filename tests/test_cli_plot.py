"""`lowbit bench kernels|e2e|serve --plot OUT.png`: the ratios of each bench's results as bars;
refused in one line before the benchmark runs when matplotlib or the directory is missing.
matplotlib is in the [test] extra (as in [plot]): these tests draw for real."""
import os
import subprocess
import sys

import pytest

from lowbit import plot

KERNELS = [dict(format="Q4_0", nt=1, ratio=1.5, threads=1), dict(format="Q4_0", nt=8, ratio=2.5, threads=1),
           dict(format="I2_S", nt=1, ratio=None, threads=1), dict(format="I2_S", nt=8, ratio=None, threads=1)]
E2E = dict(model="m.gguf", threads=2, prefill_ratio=1.25, decode_ratio=0.8)
SERVE = dict(lowbit=dict(one=50.0, many=200.0), llama=dict(one=40.0, many=100.0))


def test_series_are_the_ratio_tables():
    title, labels, ser = plot.series("kernels", KERNELS)
    assert labels == ["Q4_0", "I2_S"] and ser == {"nt=1": [1.5, None], "nt=8": [2.5, None]}
    assert "ggml time / lowbit time" in title
    assert plot.series("e2e", E2E)[1:] == (["prefill", "decode"], {"lowbit / llama.cpp": [1.25, 0.8]})
    assert plot.series("serve", SERVE)[2] == {"lowbit / llama_cpp.server": [1.25, 2.0]}
    assert plot.series("serve", dict(lowbit=SERVE["lowbit"], llama=None))[2] == {"lowbit": [4.0]}


PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("kind,res", [("kernels", KERNELS), ("e2e", E2E), ("serve", SERVE)])
def test_draw_writes_a_png(kind, res, tmp_path):
    out = tmp_path / f"{kind}.png"
    plot.draw(kind, res, str(out))
    assert out.read_bytes()[:8] == PNG and out.stat().st_size > 2000


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "lowbit.cli", *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), timeout=300)


def test_bench_kernels_plot_end_to_end(tmp_path):
    out = tmp_path / "k.png"
    r = cli("bench", "kernels", "--formats", "Q4_0,Q8_0", "--nt", "1,4", "--rows", "64", "--n", "256", "--reps", "1",
            "--plot", out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == PNG


def test_plot_problems_are_refused_before_the_benchmark(tmp_path):
    r = cli("bench", "e2e", "--plot", tmp_path / "no" / "such" / "dir.png")
    assert r.returncode == 2 and r.stderr.startswith("lowbit: error: --plot") and "does not exist" in r.stderr
    assert len(r.stderr.splitlines()) == 1
    # matplotlib missing: a stand-in that is not installed
    (tmp_path / "matplotlib.py").write_text("raise ImportError(\"No module named 'matplotlib'\", name='matplotlib')\n")
    pp = os.pathsep.join([str(tmp_path)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    r = cli("bench", "kernels", "--plot", tmp_path / "k.png", env={"PYTHONPATH": pp})
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "--plot needs matplotlib" in r.stderr and "lowbit[plot]" in r.stderr
