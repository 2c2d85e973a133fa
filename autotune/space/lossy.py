"""Which engine arguments change what a model writes, not only how fast.

fp8 weights (``quantization``), an fp8 KV cache (``kv_cache_dtype``) or a lower-precision
``dtype`` than the baseline's make a model's next-token distributions drift. Such a config may
still be what a user wants, but never without a word: the quality guard measures its drift, and
with the guard off every output names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: lossy engine arguments, and why
LOSSY_ARGS = {
    "quantization": "quantized weights",
    "kv_cache_dtype": "a quantized KV cache",
    "dtype": "a lower-precision dtype than the baseline's",
}
_NEUTRAL = {"quantization": (None, "none", ""), "kv_cache_dtype": (None, "auto")}


def lossy_changes(config: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[str]:
    """The lossy arguments of ``config`` that differ from ``baseline``'s (its fixed args), as
    ``name=value`` strings; empty for a config that writes what the baseline writes."""
    out = []
    for name in LOSSY_ARGS:
        if name not in config:
            continue
        value, base = config[name], baseline.get(name)
        if value == base or value in _NEUTRAL.get(name, (None,)):
            continue
        if name == "dtype" and value in ("float32", "auto"):  # never below the baseline's precision
            continue
        out.append(f"{name}={value}")
    return out


def lossy_parameters(names: list[str]) -> list[str]:
    """The searched parameters among ``names`` that can change outputs."""
    return [n for n in names if n in LOSSY_ARGS]
