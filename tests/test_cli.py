"""The command line refuses bad input in one line (`lowbit: error: ...`, exit 2, no traceback),
says what it does (--help with every default, --version), and behaves as a Unix tool (a
broken pipe is a quiet exit). Each case runs the real `python -m lowbit.cli` in a subprocess."""
import os
import subprocess
import sys

import pytest

import lowbit

CLI = [sys.executable, "-m", "lowbit.cli"]


def cli(*args, env=None, timeout=120, **kw):
    e = dict(os.environ, **(env or {}))
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, env=e, timeout=timeout, **kw)


def one_line_error(r, needle, code=2):
    """Exactly one stderr line, `lowbit: error: ...` naming the problem, the exit code, no traceback."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code, (r.returncode, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("lowbit: error: "), r.stderr
    assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["run", "-t", "-3"], "-t/--threads must be >= 1, got -3"),
    (["run", "-t", "0"], "-t/--threads must be >= 1, got 0"),
    (["run", "-c", "0"], "-c/--ctx must be >= 1, got 0"),
    (["run", "-n", "-2"], "-n must be >= -1, got -2"),
    (["run", "--temp", "-1"], "--temp must be >= 0"),
    (["run", "--temp", "nan"], "--temp must be >= 0"),
    (["run", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (["run", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["run", "--min-p", "-0.1"], "--min-p must be in [0, 1]"),
    (["run", "--top-k", "-1"], "--top-k must be >= 0"),
    (["run", "--repeat-penalty", "0"], "--repeat-penalty must be > 0"),
    (["run", "--presence-penalty", "2.5"], "--presence-penalty must be in [-2, 2]"),
    (["chat", "--frequency-penalty", "-3"], "--frequency-penalty must be in [-2, 2]"),
    (["run", "--seed", "-5"], "--seed must be >= -1"),
    (["run", "--spec", "0", "--lookup"], "--spec must be in 1..64"),
    (["chat", "-n", "-3"], "-n must be >= -1"),
    (["perplexity", "-f", "x.txt", "--ppl-ctx", "1"], "--ppl-ctx/--chunk must be >= 2"),
    (["serve", "--port", "99999"], "--port must be in 0..65535, got 99999"),
    (["serve", "--port", "-1"], "--port must be in 0..65535"),
    (["serve", "--parallel", "0"], "-np/--parallel must be >= 1"),
    (["synth", "dense", "/tmp/never.gguf", "--heads", "0"], "--heads must be >= 1, got 0"),
    (["synth", "dense", "/tmp/never.gguf", "--dim", "100", "--heads", "3"], "--dim 100 must be a multiple of --heads 3"),
    (["synth", "dense", "/tmp/never.gguf", "--heads", "4", "--kv-heads", "3"], "multiple of --kv-heads 3"),
    (["synth", "moe", "/tmp/never.gguf", "--experts", "4", "--top-k", "5"], "--top-k 5 must be at most --experts 4"),
    (["bench", "kernels", "--threads", "0"], "--threads must be >= 1"),
    (["bench", "kernels", "--formats", "Q4_1,Q4_K", "--n", "576"], "--n 576: Q4_K's rows take a multiple of 256 values"),
    (["bench", "kernels", "--formats", "Q4_0", "--n", "48"], "--n 48: Q4_0's rows take a multiple of 32 values"),
    (["bench", "kernels", "--n", "0"], "--n must be >= 1"),
    (["bench", "e2e", "--reps", "0"], "--reps must be >= 1"),
])
def test_bad_numbers_are_one_line_errors(args, needle, capsys):
    """In process (fast): main's exit code and stderr; the subprocess cases below show the same
    holds for the real command, imports included."""
    from lowbit.cli import main
    code = main(args)
    one_line_error(subprocess.CompletedProcess(args, code, "", capsys.readouterr().err), needle)


@pytest.mark.parametrize("args,needle", [
    (["synth", "dense", "/tmp/never.gguf", "--heads", "0"], "--heads must be >= 1, got 0"),
    (["serve", "--port", "99999"], "--port must be in 0..65535, got 99999"),
    (["run", "-t", "0"], "-t/--threads must be >= 1, got 0"),
])
def test_bad_numbers_in_a_subprocess(args, needle):
    one_line_error(cli(*args), needle)


@pytest.mark.parametrize("var,value,needle", [
    ("LOWBIT_THREADS", "abc", "LOWBIT_THREADS='abc' is not an integer"),
    ("LOWBIT_THREADS", "0", "LOWBIT_THREADS=0 must be in 1..1024"),
    ("LOWBIT_THREADS", "5000", "LOWBIT_THREADS=5000 must be in 1..1024"),
    ("LOWBIT_I2S_GEMM_MIN_NT", "-1", "LOWBIT_I2S_GEMM_MIN_NT=-1"),
])
def test_bad_environment_is_a_one_line_error(var, value, needle, monkeypatch, capsys):
    from lowbit.cli import main
    monkeypatch.setenv(var, value)
    code = main(["run", "-n", "1"])
    one_line_error(subprocess.CompletedProcess([], code, "", capsys.readouterr().err), needle)


def test_bad_environment_in_a_subprocess():
    one_line_error(cli("run", "-n", "1", env={"LOWBIT_THREADS": "abc"}), "LOWBIT_THREADS='abc' is not an integer")


@pytest.mark.parametrize("content,extra,needle", [
    (None, [], "cannot read it"),
    ("{not json", [], "not JSON"),
    ("[1, 2]", [], "a schema is a JSON object, not list"),
    ('{"type": "no-such-type"}', [], "--json-schema"),
    ('{"type": "object"}', ["--lookup"], "--json-schema needs plain decoding"),
])
def test_json_schema_errors_before_loading(tmp_path, content, extra, needle):
    pytest.importorskip("llguidance", reason="structured output needs llguidance (lowbit[server])")
    f = tmp_path / "s.json"
    if content is not None:
        f.write_text(content)
    one_line_error(cli("run", "-n", "4", "--json-schema", f, *extra), needle)


def test_paths_are_named_for_what_they_are(tmp_path):
    one_line_error(cli("run", "-m", tmp_path), f"{tmp_path} is a directory, not a GGUF file")
    one_line_error(cli("run", "-m", tmp_path / "missing.gguf", "-n", "1"), "No such file or directory", code=1)
    one_line_error(cli("run", "-f", tmp_path, "-n", "1"), f"{tmp_path} is a directory, not a text file")
    one_line_error(cli("run", "-f", tmp_path / "none.txt", "-n", "1"), "cannot read")
    if os.geteuid() != 0:  # root reads everything
        f = tmp_path / "secret.gguf"
        f.write_bytes(b"GGUF")
        f.chmod(0)
        one_line_error(cli("run", "-m", f, "-n", "1"), "Permission denied", code=1)


def test_version_and_help_with_every_default():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"lowbit {lowbit.__version__}"
    r = cli("run", "--help")
    assert r.returncode == 0
    h = " ".join(r.stdout.split())
    for d in ("(default: 0.8)", "(default: 40)", "(default: 0.95)", "(default: 0.05)", "(default: 1.0)",
              "(default: -1)", "(default: 128)", "The quick brown fox", "-1 = until"):
        assert d in h, (d, h)
    h = " ".join(cli("chat", "--help").stdout.split())
    for d in ("(default: 0.8)", "(default: 40)", "/clear", "/exit", '"""', "Ctrl-C"):
        assert d in h, (d, h)
    assert "(default: 8080)" in " ".join(cli("serve", "--help").stdout.split())


def test_bench_e2e_without_llama_cpp_python(tmp_path):
    """A stand-in llama_cpp module that is not installed: the command says what to install."""
    (tmp_path / "llama_cpp.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'llama_cpp'\", name='llama_cpp')\n")
    pp = os.pathsep.join([str(tmp_path)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    r = cli("bench", "e2e", "--reps", "1", env={"PYTHONPATH": pp})
    one_line_error(r, "needs llama-cpp-python")
    assert "lowbit[bench]" in r.stderr


def test_too_many_threads_warn_and_are_capped():
    n = len(os.sched_getaffinity(0))
    r = cli("run", "-t", "1000", "-n", "2", "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert f"lowbit: warning: -t/--threads 1000 is more than the {n} CPUs this process may use; using {n}" in r.stderr


def test_a_context_too_large_for_memory_is_a_one_line_error():
    # 10^8 positions of the default model's f16 cache are ~2.3 TB: the allocation fails, and the
    # error names the context and what to lower (it was nanobind's bare "std::bad_alloc")
    r = cli("run", "-c", 100_000_000, "-n", "1", "-p", "hi")
    one_line_error(r, "out of memory allocating the KV cache and buffers for a context of 100000000 positions", code=1)
    assert "lower the context (-c/--ctx" in r.stderr


def test_ctx_above_training_warns_and_full_context_is_announced():
    train = lowbit.load(n_ctx=8).config.train_ctx
    r = cli("run", "-c", train + 1, "-n", "1", "--temp", "0")
    assert r.returncode == 0 and f"exceeds the model's training context ({train} tokens)" in r.stderr, r.stderr
    r = cli("run", "-c", "24", "-n", "-1", "--temp", "0", "-p", "Count: 1, 2, 3,")
    assert r.returncode == 0, r.stderr
    assert "the context is full (24 tokens): generation stopped" in r.stderr
    assert "Traceback" not in r.stderr


def test_file_without_prompt_is_the_prompt(tmp_path):
    """-f alone: the file is the whole prompt (nothing hidden appended); -f and -p: file, newline, -p."""
    f = tmp_path / "p.txt"
    f.write_text("The capital of France is")
    m = lowbit.load(n_ctx=64)
    alone = "".join(m.generate("The capital of France is", max_tokens=6))
    r = cli("run", "-f", f, "-n", "6", "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == alone + "\n"
    n_prompt = len(m.tokenize("The capital of France is"))
    assert f"prefill {n_prompt} tokens" in r.stderr
    both = "".join(m.generate("The capital of France is\nAnswer:", max_tokens=6))
    r = cli("run", "-f", f, "-p", "Answer:", "-n", "6", "--temp", "0")
    assert r.stdout == both + "\n"
    r = cli("run", "-f", "-", "-n", "6", "--temp", "0", input="The capital of France is")
    assert r.stdout == alone + "\n"


def test_n_minus_one_runs_until_the_end(tmp_path):
    m = lowbit.load(n_ctx=40)
    want = "".join(m.generate("Count: 1, 2, 3,", max_tokens=-1))
    r = cli("run", "-c", "40", "-n", "-1", "--temp", "0", "-p", "Count: 1, 2, 3,")
    assert r.returncode == 0 and r.stdout == want + "\n", r.stderr
    r = cli("run", "-n", "0", "-p", "hello")
    assert r.returncode == 0 and r.stdout == "" and "decode 0 tokens" in r.stderr


def test_broken_pipe_is_a_quiet_exit():
    """`lowbit run ... | head -c 1`: no 'Broken pipe', no traceback, exit 0."""
    p = subprocess.Popen(CLI + ["run", "-n", "200", "-p", "Count: 1, 2, 3,", "--temp", "0", "-c", "256"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(1)
    p.stdout.close()  # the reader goes away while lowbit still writes
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0, err
    assert "Broken pipe" not in err and "Traceback" not in err and "Exception ignored" not in err, err


def test_sampling_is_the_default_and_temp_zero_is_greedy():
    """run samples by default (llama.cpp's defaults: two seeds differ somewhere) and --temp 0
    is greedy (the same text as the API's greedy generate)."""
    m = lowbit.load(n_ctx=64)
    greedy = "".join(m.generate("Once upon a time", max_tokens=12))
    r = cli("run", "-p", "Once upon a time", "-n", "12", "--temp", "0")
    assert r.stdout == greedy + "\n"
    outs = {cli("run", "-p", "Once upon a time", "-n", "12", "--seed", s).stdout for s in (1, 2, 3)}
    assert len(outs) > 1 or greedy + "\n" not in outs


def test_prompt_as_an_argument():
    """`lowbit run "PROMPT"` is `lowbit run -p "PROMPT"`; both at once is a usage error."""
    m = lowbit.load(n_ctx=64)
    greedy = "".join(m.generate("The capital of France is", max_tokens=8))
    r = cli("run", "The capital of France is", "-n", "8", "--temp", "0")
    assert r.returncode == 0 and r.stdout == greedy + "\n", r.stderr
    one_line_error(cli("run", "-p", "a", "b", "-n", "1"), "the prompt twice: give it as PROMPT or as -p, not both")


def test_penalties_reach_run():
    """--presence-penalty / --frequency-penalty give the API's penalised greedy text, which is not
    the plain greedy text (the flags are not dropped)."""
    m = lowbit.load(n_ctx=128)
    prompt = "List the days of the week: Monday, Tuesday,"
    greedy = "".join(m.generate(prompt, max_tokens=24))
    want = "".join(m.generate(prompt, max_tokens=24, frequency_penalty=2.0, presence_penalty=1.0))
    assert want != greedy
    r = cli("run", "-p", prompt, "-n", "24", "--temp", "0", "--frequency-penalty", "2", "--presence-penalty", "1")
    assert r.stdout == want + "\n"


@pytest.mark.parametrize("args,needle", [
    (["run", "-t", "abc"], "argument -t/--threads: invalid int value: 'abc'"),
    (["run", "--temp", "hot"], "argument --temp: invalid float value: 'hot'"),
    (["run", "--nope"], "unrecognized arguments: --nope"),
    (["bench", "nothing"], "invalid choice: 'nothing'"),
    (["quantize", "in.gguf"], "the following arguments are required"),
])
def test_argparse_errors_are_one_line_too(args, needle, capsys):
    from lowbit.cli import main
    with pytest.raises(SystemExit) as e:
        main(args)
    one_line_error(subprocess.CompletedProcess(args, e.value.code, "", capsys.readouterr().err), needle)
    if args[0] == "run":
        one_line_error(cli(*args), needle)


def test_info_describes_a_model(tmp_path, capsys):
    """`lowbit info -m`: the shape written into the file, each format with its tensor count and
    the row kernel dispatch picks for it, and the token's cost (model_work's count)."""
    from lowbit._native import lib
    from lowbit.bench import model_work
    from lowbit.cli import main
    from lowbit.synth import synth_dense
    p = synth_dense(tmp_path / "m.gguf", layers=2, dim=256, ffn=512, heads=4, kv_heads=2, wtype="Q4_K",
                    embd_type="Q8_0", head_type="Q6_K")
    assert main(["info", "-m", str(p)]) == 0
    out = capsys.readouterr().out
    assert "arch      llama: 2 layers, width 256, 4 heads / 2 KV heads of 64, FFN 512, vocab 49152" in out
    q4k = next(line for line in out.splitlines() if line.strip().startswith("Q4_K") and "tensors" not in line
               and line.startswith(" " * 10))
    from lowbit.kernels import repacked_layouts
    kid = 1002 if "Q4_K" in repacked_layouts() else 12  # 12: Q4_K; 1002: its repacked layout's kernels
    assert q4k.split()[1] == "14" and lib.kernel(kid, 1)[0] in q4k  # 7 matrices a layer
    assert f"decode reads {model_work(str(p))['bytes'] / 1e6:.0f} MB" in out
    assert "the KV cache holds 1,024 bytes a position (f16/f16)" in out  # 2 layers x 2 x 64 x (K, V) x 2 B
