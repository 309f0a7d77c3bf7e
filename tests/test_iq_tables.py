"""csrc/ref/iq_tables.h: regenerated from gguf-py it must equal the checked-in file, and
its entries must mean what ggml-common.h means (packing, sign parity, code book)."""
import importlib.util
import pathlib
import re

import pytest

pytest.importorskip("gguf")

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEADER = ROOT / "csrc" / "ref" / "iq_tables.h"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_iq_tables", ROOT / "tools" / "gen_iq_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gen():
    return _generator()


@pytest.fixture(scope="module")
def tables(gen):
    return gen.build_tables()


def _parse_header_array(text, name):
    m = re.search(r"\b" + name + r"\[(\d+)\] = \{(.*?)\};", text, re.S)
    assert m, name
    values = [int(v, 0) for v in re.findall(r"-?0x[0-9a-f]+|-?\d+", m.group(2))]
    assert len(values) == int(m.group(1))
    return values


def test_header_matches_fresh_generation(gen, tables):
    assert HEADER.read_text() == gen.render_header(tables), (
        "csrc/ref/iq_tables.h drifted from gguf-py; run python tools/gen_iq_tables.py")


def test_header_parses_back_to_the_tables(tables):
    text = HEADER.read_text()
    for name, (ctype, data) in tables.items():
        if ctype != "float":
            assert _parse_header_array(text, name) == data, name


def _bytes_of(word, n):
    return [(word >> (8 * j)) & 0xFF for j in range(n)]


def test_grid_packing_matches_ggml(tables):
    # First rows of ggml-common.h: element j is byte j, little-endian.
    iq2xxs = tables["iq2xxs_grid"][1]
    assert iq2xxs[0] == 0x0808080808080808 and iq2xxs[1] == 0x080808080808082B
    assert iq2xxs[255] == 0x2B2B2B1908081908
    assert tables["iq2xs_grid"][1][511] == 0x2B2B2B2B2B2B2B2B
    assert tables["iq2s_grid"][1][1023] == 0x2B2B2B2B2B2B2B2B
    assert tables["iq3xxs_grid"][1][:2] == [0x04040404, 0x04040414]
    assert tables["iq3s_grid"][1][:2] == [0x01010101, 0x01010103]
    iq1 = tables["iq1s_grid"][1]
    assert iq1[0] == 0xFFFFFFFFFFFFFFFF and iq1[1] == 0xFFFFFFFFFFFFFF01
    assert iq1[2047] == 0x0101010101010101
    # Value sets of each grid.
    allowed = {
        "iq2xxs_grid": ({0x08, 0x19, 0x2B}, 8), "iq2xs_grid": ({0x08, 0x19, 0x2B}, 8),
        "iq2s_grid": ({0x08, 0x19, 0x2B}, 8), "iq1s_grid": ({0xFF, 0x00, 0x01}, 8),
        "iq3xxs_grid": ({0x04, 0x0C, 0x14, 0x1C, 0x24, 0x2C, 0x34, 0x3E}, 4),
        "iq3s_grid": (set(range(1, 16, 2)), 4),
    }
    for name, (values, n) in allowed.items():
        words = tables[name][1]
        assert len(set(words)) == len(words), f"{name} has duplicate rows"
        for w in words:
            assert set(_bytes_of(w, n)) <= values, name


def test_ksigns_definition(tables):
    ks = tables["ksigns_iq2xs"][1]
    assert len(ks) == 128
    for i, s in enumerate(ks):
        assert s & 0x7F == i
        assert bin(s).count("1") % 2 == 0  # an even number of negative lanes
    assert ks[:8] == [0, 129, 130, 3, 132, 5, 6, 135]  # ggml-common.h's first row


def test_kvalues_and_deltas(tables):
    kv = tables["kvalues_iq4nl"][1]
    assert kv == [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
    assert tables["iq1s_delta"][1] == 0.125 and tables["iq1m_delta"][1] == 0.125
