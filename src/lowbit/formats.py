"""The format table, read from the extension (csrc/formats.h is the only copy)."""
from __future__ import annotations

from dataclasses import dataclass

from ._native import lib


@dataclass(frozen=True)
class Format:
    id: int          # GGUF / ggml type id (I2_S = 36; I8_S, activation only, = 1001)
    name: str
    block: int       # values per block
    bytes: int       # bytes per block
    act: str         # the activation format its row kernel takes
    weight: bool     # usable as a weight format
    activation: bool # is an activation format

    def row_bytes(self, n: int) -> int:
        """Bytes of one row of n values (n a positive multiple of the block)."""
        return lib.row_bytes(self.id, n)

    @property
    def tensor_pad(self) -> int:
        """Bytes a whole tensor carries after its rows (I2_S: the scale and its pad)."""
        return lib.tensor_pad(self.id)


def _load() -> tuple[dict[str, Format], dict[int, Format]]:
    rows = lib.formats()
    names = {r[0]: r[1] for r in rows}
    by_name = {}
    for fid, name, block, nbytes, act, weight, activation in rows:
        by_name[name] = Format(fid, name, block, nbytes, names[act], weight, activation)
    return by_name, {f.id: f for f in by_name.values()}


BY_NAME, BY_ID = _load()


def formats() -> list[Format]:
    """Every format lowbit knows, weights and activations."""
    return list(BY_NAME.values())


def get(fmt: str | int | Format) -> Format:
    """Look a format up by name (case-insensitive), id, or pass a Format through."""
    if isinstance(fmt, Format):
        return fmt
    if isinstance(fmt, str):
        f = BY_NAME.get(fmt.upper())
        if f is None:
            raise ValueError(f"unknown format {fmt!r}; known: {', '.join(BY_NAME)}")
        return f
    if isinstance(fmt, int) and not isinstance(fmt, bool):
        f = BY_ID.get(fmt)
        if f is None:
            raise ValueError(f"unknown format id {fmt}")
        return f
    raise TypeError(f"a format is a name, an id or a Format, not {type(fmt).__name__}")


# llama-quant's tensor_type_fallback: the format a tensor whose rows the target's blocks do not divide
# gets instead (F16 where the fallback's blocks do not divide them either). quantize and synth use it.
FALLBACK = {"IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL",
            "IQ2_S": "IQ4_NL", "IQ3_XXS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ4_XS": "IQ4_NL",
            "Q2_K": "Q4_0", "Q3_K": "Q4_0", "TQ1_0": "Q4_0", "TQ2_0": "Q4_0",
            "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def fit_type(fmt: str, n: int) -> str:
    """fmt if a row of n values is whole blocks of it, else its FALLBACK (F16 as the last resort)."""
    if n % get(fmt).block == 0:
        return get(fmt).name
    back = FALLBACK.get(get(fmt).name)
    return back if back and n % get(back).block == 0 else "F16"
