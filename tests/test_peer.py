"""The llama.cpp peer (lowbit.peer): the probe switches llama.cpp's extra buffer types off where
its default configuration crashes, the verdict is cached per process tree, the flag reaches
llama.cpp, and a crashing peer is a message, never a dead lowbit process.

Crashes are made with a fake peer: LOWBIT_PEER_PYTHON points the peer's children at a shell
script that kills itself with SIGSEGV (for the configurations the test says). The real probe
runs too, on the default model, and must pass whether or not this host's llama.cpp crashes."""
import io
import os
import stat
import subprocess
import sys

import pytest

import lowbit
from lowbit import peer

pytest.importorskip("llama_cpp")


@pytest.fixture
def clean_env(monkeypatch):
    for k in (peer.ENV_CACHE, peer.ENV_FORCE, peer.ENV_PYTHON):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def path():
    return lowbit.model.default_model_path()


def fake_peer(tmp_path, crash_when: str, log: str | None = None) -> str:
    """A stand-in for the peer's python: dies with SIGSEGV when its arguments match the shell
    pattern `crash_when` (e.g. '* probe * on *'), else exits 0. Appends its arguments to `log`."""
    p = tmp_path / "fake-peer.sh"
    record = f'echo "$*" >> "{log}"\n' if log else ""
    p.write_text(f'#!/bin/sh\n{record}case "$*" in\n  {crash_when}) kill -SEGV $$ ;;\nesac\nexit 0\n')
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_a_peer_that_crashes_with_extra_bufts_switches_them_off(clean_env, tmp_path, path, capsys):
    clean_env.setenv(peer.ENV_PYTHON, fake_peer(tmp_path, "*probe*\\ on\\ *"))
    cfg = peer.config(path)
    assert not cfg.extra_bufts and cfg.reason == "SIGSEGV" and cfg.how == "probed"
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["llama.cpp peer: extra buffer types off (their AMX/repack path crashes on this CPU: SIGSEGV; "
                   "probed)"]
    assert f"{peer.model_key(path)}=off" in os.environ[peer.ENV_CACHE]


def test_a_peer_that_survives_keeps_the_default(clean_env, tmp_path, path, capsys):
    clean_env.setenv(peer.ENV_PYTHON, fake_peer(tmp_path, "*never*"))
    cfg = peer.config(path)
    assert cfg.extra_bufts and cfg.how == "probed"
    assert capsys.readouterr().err == ""


def test_a_peer_that_crashes_either_way_is_a_clear_error(clean_env, tmp_path, path):
    clean_env.setenv(peer.ENV_PYTHON, fake_peer(tmp_path, "*probe*"))
    with pytest.raises(peer.PeerCrashed, match=r"^peer crashed: .* on \(SIGSEGV\) and off \(SIGSEGV\)"):
        peer.config(path)


def test_the_verdict_is_cached_for_the_process_tree(clean_env, tmp_path, path):
    log = tmp_path / "calls.txt"
    clean_env.setenv(peer.ENV_PYTHON, fake_peer(tmp_path, "*probe*\\ on\\ *", log=str(log)))
    assert not peer.config(path).extra_bufts
    assert len(log.read_text().splitlines()) == 2  # on (crashed), then off (survived)
    assert peer.config(path).how == "cached"
    # a child process inherits it (the fake peer python is still set: a probe would log a line)
    r = subprocess.run([sys.executable, "-c", "import sys; from lowbit import peer; c = peer.config(sys.argv[1]); "
                        "print(c.how, c.extra_bufts)", path], capture_output=True, text=True, env=os.environ.copy())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cached", "False"]
    assert len(log.read_text().splitlines()) == 2
    # another kind of model is probed on its own
    other = tmp_path / "other.gguf"
    other.write_bytes(b"not a gguf")
    assert peer.model_key(str(other)) != peer.model_key(path)
    peer.config(str(other))
    assert len(log.read_text().splitlines()) == 4


def test_the_override_skips_the_probe(clean_env, tmp_path, path):
    log = tmp_path / "calls.txt"
    clean_env.setenv(peer.ENV_PYTHON, fake_peer(tmp_path, "*", log=str(log)))
    clean_env.setenv(peer.ENV_FORCE, "off")
    cfg = peer.config(path)
    assert not cfg.extra_bufts and "forced" in cfg.how and not log.exists()


def test_the_flag_reaches_llama_cpp(clean_env, path):
    import llama_cpp
    assert llama_cpp.llama_model_default_params().use_extra_bufts  # llama.cpp's default is on
    # (with them on, it runs only where this host's probe found them safe: on an AMX CPU they
    # crash inside llama_decode, which here would be this test process)
    safe = peer.config(path).extra_bufts
    for on in (False, True):
        llm = peer.Llama(path, extra_bufts=on, n_ctx=64, n_threads=1)
        assert bool(llm.model_params.use_extra_bufts) is on
        if safe or not on:
            llm.eval(llm.tokenize(b"The capital of France is"))  # and it runs
        del llm
    assert llama_cpp.llama_model_default_params().use_extra_bufts  # the wrapper is undone
    clean_env.setenv(peer.ENV_FORCE, "off")
    assert peer.Llama(path, n_ctx=64, n_threads=1).model_params.use_extra_bufts is False


def test_the_real_probe_on_this_host(clean_env, path, capsys):
    """Whatever this host's llama.cpp does: a verdict, and if off, the signal it died of."""
    cfg = peer.config(path)
    assert cfg.how == "probed"
    if not cfg.extra_bufts:
        assert cfg.reason and "extra buffer types off" in capsys.readouterr().err
    llm = peer.Llama(path, n_ctx=64, n_threads=1)
    assert bool(llm.model_params.use_extra_bufts) is cfg.extra_bufts


def test_a_worker_that_crashes_is_reported(clean_env, tmp_path, path):
    clean_env.setenv(peer.ENV_FORCE, "on")
    clean_env.setenv(peer.ENV_PYTHON, fake_peer(tmp_path, "*worker*"))
    with pytest.raises(peer.PeerCrashed, match=r"^peer crashed: llama.cpp died with SIGSEGV"):
        peer.Worker(path, n_ctx=64)


def test_the_worker_runs_llama_cpp(clean_env, path):
    with peer.Worker(path, n_ctx=64, n_threads=1, n_threads_batch=1) as w:
        prefill, decode = w.timed_greedy(list(range(1, 17)), 2)
    assert prefill > 0 and decode > 0


def test_bench_e2e_survives_a_crashing_peer(clean_env, tmp_path, path):
    from lowbit.bench import bench_e2e
    clean_env.setenv(peer.ENV_FORCE, "on")
    clean_env.setenv(peer.ENV_PYTHON, fake_peer(tmp_path, "*worker*"))
    out = io.StringIO()
    res = bench_e2e(path, threads=1, prompt_tokens=16, gen_tokens=2, reps=1, out=out)
    text = out.getvalue()
    assert "peer crashed: llama.cpp died with SIGSEGV" in text
    assert res["lowbit_decode_tps"] > 0 and res["llama_decode_tps"] is None and res["decode_ratio"] is None
    assert res["prefill_ratios"] == [] and res["prefill_ratio_paired"] is None and "ratio per repetition" not in text
    assert "decode" in text and "llama.cpp peer:" in text


def test_bench_e2e_prints_each_repetitions_paired_ratio(clean_env, path):
    """Each repetition's lowbit and llama.cpp runs (back to back) give that repetition's ratio,
    llama.cpp's time over lowbit's; the median of those is printed beside the per-side medians."""
    from lowbit.bench import bench_e2e
    out = io.StringIO()
    res = bench_e2e(path, threads=1, prompt_tokens=16, gen_tokens=2, reps=3, out=out)
    reps = res["reps"]
    assert len(reps) == 3 and all(r["llama_prefill_s"] > 0 and r["lowbit_decode_s"] > 0 for r in reps)
    assert res["prefill_ratios"] == [r["llama_prefill_s"] / r["lowbit_prefill_s"] for r in reps]
    assert res["decode_ratios"] == [r["llama_decode_s"] / r["lowbit_decode_s"] for r in reps]
    assert res["prefill_ratio_paired"] == sorted(res["prefill_ratios"])[1]
    assert res["decode_ratio_paired"] == sorted(res["decode_ratios"])[1]
    line = next(ln for ln in out.getvalue().splitlines() if ln.startswith("ratio per repetition"))
    assert f"(median {res['prefill_ratio_paired']:.2f})" in line and f"(median {res['decode_ratio_paired']:.2f})" in line
    assert all(f"{x:.2f}" in line for x in res["prefill_ratios"] + res["decode_ratios"])


def test_bench_e2e_loads_lowbit_s_weights_as_asked(clean_env, tmp_path, path, monkeypatch):
    """bench e2e's memory (the CLI's --no-mmap / --hugepages / --mlock) reaches lowbit's load and
    is printed; llama.cpp's side (here a crashing fake peer) is not affected."""
    from lowbit import bench, model
    clean_env.setenv(peer.ENV_FORCE, "on")
    clean_env.setenv(peer.ENV_PYTHON, fake_peer(tmp_path, "*worker*"))
    seen = []
    real = model.load
    monkeypatch.setattr(model, "load", lambda *a, **k: (seen.append(k), real(*a, **k))[1])
    out = io.StringIO()
    res = bench.bench_e2e(path, threads=1, prompt_tokens=16, gen_tokens=2, reps=1, out=out,
                          memory=dict(memory="copy", mlock=False))
    assert [(k["memory"], k["mlock"]) for k in seen] == [("copy", False)]
    assert res["memory"] == "copy" and "lowbit's weights: copy" in out.getvalue()
    assert res["lowbit_decode_tps"] > 0


def test_the_server_launcher_applies_the_flag(clean_env, tmp_path):
    """`python -m lowbit.peer server off ...` runs llama_cpp.server's main with the flag set
    (its --help is enough to start it without a model)."""
    r = subprocess.run([sys.executable, "-m", "lowbit.peer", "server", "off", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "llama.cpp peer: llama_cpp.server with use_extra_bufts=False" in r.stderr
    assert "--model" in r.stdout
    clean_env.setenv(peer.ENV_FORCE, "off")
    argv = peer.server_argv("m.gguf", ["--port", "1"])
    assert argv[1:5] == ["-m", "lowbit.peer", "server", "off"] and argv[-2:] == ["--port", "1"]


def test_without_llama_cpp_the_peer_commands_exit_2_in_one_line():
    code = ("import sys; sys.modules['llama_cpp'] = None; from lowbit.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    for args in (["bench", "kernels", "--formats", "Q4_0", "--reps", "1"], ["bench", "e2e", "--reps", "1"],
                 ["parity", "--formats", "Q4_0"]):
        r = subprocess.run([sys.executable, "-c", code] + args, capture_output=True, text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if k != "LOWBIT_GGML_LIB_DIR"})
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("lowbit: error: this needs llama-cpp-python (ggml and llama.cpp, the peer), "
                                   "which is not installed: pip install 'lowbit[bench]'")
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_llama_cpp_is_made_in_one_place():
    """Every llama.cpp model object of the tests, tools and benchmarks comes from lowbit.peer (so
    the probe protects every one of them); llama_cpp.server is launched through it too."""
    import re
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pattern = re.compile(r"llama_cpp\.Llama\(|from llama_cpp import .*\bLlama\b|\"llama_cpp\.server\"")
    bad = []
    for d in ("src/lowbit", "tests", "tools"):
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            for f in files:
                p = os.path.join(dirpath, f)
                if not f.endswith(".py") or p.endswith(os.path.join("lowbit", "peer.py")):
                    continue
                for i, line in enumerate(open(p, encoding="utf-8"), 1):
                    if pattern.search(line) and not line.lstrip().startswith("#") and "test_peer.py" not in p:
                        bad.append(f"{os.path.relpath(p, root)}:{i}: {line.strip()}")
    assert not bad, "llama.cpp made outside lowbit.peer:\n" + "\n".join(bad)
