import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import lowbit  # noqa: E402
from lowbit._native import lib  # noqa: E402

LEVELS = list(lib.levels())  # every level this CPU, build and LOWBIT_MAX_ISA allow


@pytest.fixture(scope="session")
def ggml():
    from lowbit.ggml_oracle import ggml as get
    return get()


@pytest.fixture
def rng(request):
    # a fixed seed per test id: failures reproduce
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def pytest_report_header(config):
    c = lib.cpu_info()
    return f"lowbit: CPU {c['model']}; levels under test: {', '.join(LEVELS)} (selected {c['selected']})"
