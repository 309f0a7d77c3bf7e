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
