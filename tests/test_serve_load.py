"""Load and fault test of `lowbit serve`, scaled down for the suite (the full 2000 requests run in
`lowbit bench serve --load 2000`, BENCHMARKS.md): 64 concurrent clients with mixed prompt and
reply lengths, 20% of the streams cancelled mid-way, 5% malformed bodies. No crash, no leaked
slot, every accepted request completes or gets a clear error, resident memory after the run
within 10% of after the warm-up (lowbit.server.loadtest checks each)."""
import os

import pytest

from lowbit.server.loadtest import load_test
from serve_util import running, synth_model

SCALAR = os.environ.get("LOWBIT_MAX_ISA") == "scalar"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = synth_model(tmp_path_factory.mktemp("load") / "synth.gguf")
    with running("-m", path, "--ctx", "512", "--parallel", "8", "-t", "2", "--queue", "256", "--cache-mb", "2",
               "--no-access-log") as s:
        yield s


def test_64_clients_cancels_and_malformed_bodies(server):
    res = load_test(server.url, server.proc.pid, clients=64, requests=160 if SCALAR else 320, max_tokens=24,
                    max_words=200, warmup=64)
    c = res["counts"]
    print(res)
    assert not res["problems"], res["problems"][:10]
    assert server.proc.poll() is None
    assert c.get("malformed", 0) > 0 and c.get("cancelled", 0) > 0 and c.get("completed", 0) > 0.5 * res["requests"]
    assert sum(c.values()) == res["requests"]
    st = res["status"]
    assert st["active"] == 0 and st["queued"] == 0 and st["free_slots"] == 8
