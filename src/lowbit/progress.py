"""Progress bars of the long commands (quantize, imatrix, synth): tqdm on stderr, counting
bytes (MB/s, ETA) or steps, with the current tensor's name. Only shown on a terminal; tqdm is
a dependency, and a missing tqdm only costs the bar."""
from __future__ import annotations

import sys


class _Bar:
    def __init__(self, total: int | None, what: str, unit: str):
        from tqdm import tqdm
        kw = dict(unit="B", unit_scale=True, unit_divisor=1024) if unit == "B" else dict(unit=unit)
        self._t = tqdm(total=total, desc=what, file=sys.stderr, leave=True, dynamic_ncols=True, **kw)

    def update(self, n: int, label: str = "") -> None:
        if label:
            self._t.set_postfix_str(label, refresh=False)
        self._t.update(n)

    def close(self) -> None:
        self._t.close()


class _Silent:
    def update(self, n: int, label: str = "") -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int | None, what: str, unit: str = "B", enabled: bool = True):
    """A bar over `total` units (bytes by default); a silent one when disabled or without tqdm."""
    if not enabled:
        return _Silent()
    try:
        return _Bar(total, what, unit)
    except ImportError:
        return _Silent()
