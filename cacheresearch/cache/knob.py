"""A dynamic parameter, declared once (:class:`Knob`): the routers' and the policies' knobs.

Pure Python and NumPy (no JAX), so that the policy registry (:mod:`cacheresearch.cache.policies`) and the
shell's early checks import without the engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Knob", "KINDS", "num_text"]

KINDS = ("int", "bool", "float", "view")
_DTYPES = {"int": np.int32, "bool": np.bool_, "float": np.float32, "view": np.int32}


@dataclass(frozen=True)
class Knob:
    """One dynamic parameter, declared once.

    ``kind``: ``int`` (int32 in ``[lo, hi]``), ``bool``, ``float`` (float32, finite, ``>= lo`` and
    ``<= hi`` when given) or ``view`` (a name of ``choices``, stored as its position; an int id is
    taken as is). Integer units keep decisions exact: ``_pct`` = hundredths, ``_pm`` = thousandths.
    """

    name: str
    default: Any
    lo: int | float | None = None
    hi: int | float | None = None
    kind: str = "int"
    doc: str = ""
    unit: str | None = None
    choices: tuple[str, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"knob {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "int" and (self.lo is None or self.hi is None):
            raise ValueError(f"knob {self.name!r}: an int knob needs lo and hi")
        if self.kind == "float" and self.lo is None:
            raise ValueError(f"knob {self.name!r}: a float knob needs lo")
        if self.kind == "view" and not self.choices:
            raise ValueError(f"knob {self.name!r}: a view knob needs choices")
        self.check(self.default)
        self.value(self.default)

    @property
    def dtype(self) -> np.dtype:
        """Its dtype in :class:`~cacheresearch.core.params.Params`."""
        return np.dtype(_DTYPES[self.kind])

    def check(self, v) -> None:
        """Raise ``ValueError`` if ``v`` is outside the declared range (int and float knobs)."""
        if self.kind == "int":
            if isinstance(v, bool) or int(v) != v or not self.lo <= int(v) <= self.hi:
                raise ValueError(f"{self.name} must be an integer in [{self.lo}, {self.hi}], got {v!r}")
        elif self.kind == "float":
            f = float(v)
            if not (np.isfinite(f) and f >= self.lo and (self.hi is None or f <= self.hi)):
                rng = f">= {self.lo}" if self.hi is None else f"in [{self.lo}, {self.hi}]"
                raise ValueError(f"{self.name} must be {rng}, got {v!r}")

    def value(self, v):
        """``v`` as its Params dtype (a view by name or id; booleans; float32; int32 otherwise)."""
        if self.kind == "view":
            if isinstance(v, str):
                if v not in self.choices:
                    raise ValueError(f"unknown router {self.name} {v!r}; choose one of {sorted(self.choices)}")
                return np.int32(self.choices.index(v))
            return np.int32(int(v))
        if self.kind == "bool":
            return np.bool_(bool(v))
        if self.kind == "float":
            return np.float32(v)
        return np.int32(v)

    def range_text(self) -> str:
        if self.kind == "bool":
            return "true / false"
        if self.kind == "view":
            return ", ".join(self.choices)
        if self.hi is None:
            return f">= {self.lo}"
        return f"[{num_text(self.lo)}, {num_text(self.hi)}]"


def num_text(x) -> str:
    if isinstance(x, int) and x >= 2**16 and (x + 1) & x == 0:
        return f"2**{(x + 1).bit_length() - 1} - 1"
    if isinstance(x, int) and x >= 2**16 and (x + 2) & (x + 1) == 0:
        return f"2**{(x + 2).bit_length() - 1} - 2"
    if isinstance(x, int) and x >= 2**16 and x & (x - 1) == 0:
        return f"2**{x.bit_length() - 1}"
    return f"{x:,}" if isinstance(x, int) else str(x)


