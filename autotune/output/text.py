"""Plain-text formatting shared by the terminal views: numbers, tables, indentation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and abs(value) < 0.01:
            return f"{value:.3g}"
        if value == int(value) and abs(value) >= 1000:
            return f"{int(value):,}"
        return f"{value:,.{digits}f}" if abs(value) >= 100 else f"{value:.{max(digits, 3)}g}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int] | None = None) -> str:
    """A plain-text table; columns in ``right`` are right-aligned."""
    right = right or set()
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in pairs]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line for line in text.splitlines())
