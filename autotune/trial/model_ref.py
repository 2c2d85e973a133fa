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
