"""`hf:OWNER/REPO[:QUANT]` model names (lowbit.hub): which file a name picks from a repo's file list
(the rule is lowbit's, written out here by hand), the one-line errors, and the whole path through
lowbit.load and the CLI with huggingface_hub's two calls replaced by a fake hub that serves a
synthetic model from disk (this machine has no network; the download itself is huggingface_hub's)."""
import pytest

import lowbit
from lowbit import hub
from lowbit.synth import synth_dense

BARTOWSKI = ["README.md", "Phi-3.5-mini-instruct-IQ4_XS.gguf", "Phi-3.5-mini-instruct-Q4_K_M.gguf",
             "Phi-3.5-mini-instruct-Q8_0.gguf", "Phi-3.5-mini-instruct-f16.gguf", "mmproj-model-f16.gguf"]
QWEN = ["qwen2.5-1.5b-instruct-q4_0.gguf", "qwen2.5-1.5b-instruct-q4_k_m.gguf", "qwen2.5-1.5b-instruct-q8_0.gguf"]


@pytest.mark.parametrize("files, quant, want", [
    (BARTOWSKI, "Q8_0", "Phi-3.5-mini-instruct-Q8_0.gguf"),
    (BARTOWSKI, "iq4_xs", "Phi-3.5-mini-instruct-IQ4_XS.gguf"),   # case-insensitive
    (BARTOWSKI, "F16", "Phi-3.5-mini-instruct-f16.gguf"),         # not the projector
    (BARTOWSKI, None, "Phi-3.5-mini-instruct-Q4_K_M.gguf"),       # the default quant
    (QWEN, None, "qwen2.5-1.5b-instruct-q4_k_m.gguf"),
    (QWEN, "Q4_0", "qwen2.5-1.5b-instruct-q4_0.gguf"),            # not q4_k_m, not IQ4-anything
    (["only.gguf", "mmproj-f16.gguf"], None, "only.gguf"),        # the one model file
    (["sub/dir/m-Q6_K.gguf"], "Q6_K", "sub/dir/m-Q6_K.gguf"),
])
def test_pick(files, quant, want):
    assert hub.pick(files, "o/r", quant) == want


@pytest.mark.parametrize("files, quant, says", [
    (["a-Q8_0.gguf", "a-Q6_K.gguf"], None, "several models; name one: hf:o/r:Q6_K, hf:o/r:Q8_0"),
    (BARTOWSKI, "Q2_K", "has no Q2_K file; it has: hf:o/r:F16, hf:o/r:IQ4_XS, hf:o/r:Q4_K_M, hf:o/r:Q8_0"),
    (["README.md", "mmproj-f16.gguf"], None, "has no .gguf model file"),
    (["big-Q4_K_M-00001-of-00002.gguf", "big-Q4_K_M-00002-of-00002.gguf"], None, "split into parts"),
])
def test_pick_errors(files, quant, says):
    with pytest.raises(hub.BadHubName, match=says.replace(".", r"\.").replace(":", ":")):
        hub.pick(files, "o/r", quant)


@pytest.mark.parametrize("spec", ["hf:", "hf:onlyowner", "hf:o/r:", "hf:o/r/x.bin", "hf:o//r", "hf:o/r/f.gguf:Q4_0"])
def test_bad_names(spec):
    with pytest.raises(hub.BadHubName):
        hub.parse(spec)


def test_parse():
    assert hub.parse("hf:o/r") == ("o/r", None, None)
    assert hub.parse("hf:o/r:Q4_K_M") == ("o/r", "Q4_K_M", None)
    assert hub.parse("hf:o/r/sub/m.gguf") == ("o/r", None, "sub/m.gguf")


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """huggingface_hub's list_repo_files / hf_hub_download over a directory: repo o/r holds a
    synthetic llama as m-Q8_0.gguf; calls are recorded."""
    import huggingface_hub as hh
    root = tmp_path / "hub" / "o" / "r"
    root.mkdir(parents=True)
    synth_dense(root / "m-Q8_0.gguf", layers=1, dim=64, ffn=128, heads=2, kv_heads=1)
    calls = []

    def list_repo_files(repo_id, **kw):
        calls.append(("list", repo_id))
        if repo_id != "o/r":  # what the hub answers for a repository it does not have
            from types import SimpleNamespace
            from huggingface_hub.errors import RepositoryNotFoundError
            url = f"https://huggingface.co/api/models/{repo_id}/tree/main"
            raise RepositoryNotFoundError(f"404 {repo_id}", response=SimpleNamespace(status_code=404, headers={}, url=url,
                                                                                     request=None))
        return [p.name for p in root.iterdir()] + ["README.md"]

    def hf_hub_download(repo_id, filename, **kw):
        calls.append(("get", repo_id, filename))
        return str(root / filename)
    monkeypatch.setattr(hh, "list_repo_files", list_repo_files)
    monkeypatch.setattr(hh, "hf_hub_download", hf_hub_download)
    return calls


def test_load_by_hub_name(fake_hub):
    m = lowbit.load("hf:o/r:Q8_0", n_ctx=16)
    assert m.path.endswith("o/r/m-Q8_0.gguf") and m.forward([1, 2]).shape[0] == 1
    assert fake_hub == [("list", "o/r"), ("get", "o/r", "m-Q8_0.gguf")]
    fake_hub.clear()
    lowbit.load("hf:o/r/m-Q8_0.gguf", n_ctx=16)  # a file name: no listing
    assert fake_hub == [("get", "o/r", "m-Q8_0.gguf")]


def test_cli_by_hub_name_and_its_errors(fake_hub, capsys):
    from lowbit.cli import main
    assert main(["run", "-m", "hf:o/r", "-p", "Hi", "-n", "2"]) == 0  # the only model file
    capsys.readouterr()
    assert main(["run", "-m", "hf:o/r:Q2_K", "-p", "Hi", "-n", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "lowbit: error: hf:o/r has no Q2_K file; it has: hf:o/r:Q8_0"
    assert main(["run", "-m", "hf:nobody/none", "-p", "Hi", "-n", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lowbit: error: hf:nobody/none: no such model repository (or it is private: set HF_TOKEN)"]
