"""Check the ``--model`` argument before a study spends a trial on it."""

from __future__ import annotations

import re
from pathlib import Path

from autotune.errors import ModelError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def check_model(model: str) -> str:
    """Return the model reference to pass to vLLM: an absolute local checkpoint directory, or a
    hub id left as is (the engine resolves it, from the local cache when offline).

    Raises:
        ModelError: a local path that does not exist or holds no ``config.json``.
    """
    if not model.strip():
        raise ModelError("--model is empty; give a local checkpoint directory or a hub id")
    p = Path(model).expanduser()
    if p.exists():
        if p.is_dir() and (p / "config.json").is_file():
            return str(p.resolve())
        if p.is_file() and p.suffix == ".gguf":
            return str(p.resolve())
        raise ModelError(f"--model {model}: the directory has no config.json (not a checkpoint)")
    looks_local = model.startswith(("/", "./", "../", "~")) or model.count("/") > 1
    if looks_local or not _HUB_ID.match(model):
        raise ModelError(f"--model {model}: no such directory, and not a hub id like org/name")
    return model


#: the config keys vLLM derives a model's context length from (the smallest one present wins)
_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def _config(model: str) -> dict | None:
    import json

    try:
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def quantization_method(model: str) -> str | None:
    """How a local checkpoint's weights are quantized already (``fp8``, ``awq``, ...); None for
    full-precision weights, a hub id or an unreadable config."""
    qc = (_config(model) or {}).get("quantization_config")
    if not isinstance(qc, dict):
        return None
    return str(qc.get("quant_method") or "quantized")


def context_length(model: str) -> int | None:
    """The longest context a local checkpoint declares (what vLLM's ``max_model_len`` defaults
    to); None for a hub id, an unreadable config, or one whose rope scaling stretches it."""
    config = _config(model)
    if config is None or config.get("rope_scaling"):
        return None
    found = [
        v for k in _LENGTH_KEYS if isinstance(v := config.get(k), int) and not isinstance(v, bool) and v > 0
    ]
    return min(found) if found else None
