"""LOWBIT_GGML_LIB_DIR: the ggml peer and oracle from another build's directory."""
import os

import pytest

from lowbit import ggml_oracle


def test_lib_dir_follows_the_environment(monkeypatch, tmp_path):
    wheel = ggml_oracle._lib_dir()  # the llama-cpp-python wheel's lib/ (the default)
    assert os.path.exists(os.path.join(wheel, "libggml-cpu.so"))
    monkeypatch.setenv("LOWBIT_GGML_LIB_DIR", wheel)
    assert ggml_oracle._lib_dir() == wheel
    monkeypatch.setenv("LOWBIT_GGML_LIB_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match=f"no libggml-cpu.so in {tmp_path}"):
        ggml_oracle._lib_dir()
