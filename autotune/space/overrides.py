"""Engine args given by hand: ``--set ARG=VALUE`` pairs, and configs as JSON (inline, a file, or
an ``autotune export`` whose ``engine_kwargs`` are taken). Shared by ``autotune run`` and
``benchmarks.compare``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError


def parse_assignments(items: list[str], flag: str = "--set") -> dict[str, Any]:
    """``ARG=VALUE`` pairs; values are YAML scalars (``true``, ``8192``, ``0.9``, ``dummy``)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise AutotuneError(f"{flag} {item!r}: use ARG=VALUE, e.g. {flag} max_model_len=4096")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def config_from_json(text: str, where: str) -> dict[str, Any]:
    """Engine args from JSON text: an object of them, or an export (its ``engine_kwargs``);
    ``model`` is dropped (the study's or the benchmark's model runs)."""
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise AutotuneError(f"{where}: not a JSON object or a JSON file ({e.msg})") from None
    if isinstance(cfg, dict) and isinstance(cfg.get("engine_kwargs"), dict):
        cfg = cfg["engine_kwargs"]  # an export file: re-measure its config
    if not isinstance(cfg, dict):
        raise AutotuneError(f"{where}: must be a JSON object of engine args")
    return {k: v for k, v in cfg.items() if k != "model"}


def read_config_file(path: str, where: str) -> str:
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise AutotuneError(
            f"{where}: not a JSON object and not a readable file ({reason}); give the config "
            "inline, e.g. '{\"max_num_seqs\": 256}', or a path to a JSON file"
        ) from None


def load_config(item: str, flag: str) -> dict[str, Any]:
    """A config given inline (``{...}``) or as a path to a JSON or export file."""
    where = f"{flag} {item[:60]!r}"
    text = item if item.lstrip().startswith("{") else read_config_file(item, where)
    return config_from_json(text, where)
