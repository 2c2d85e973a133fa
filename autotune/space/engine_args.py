"""What the installed vLLM accepts: its ``EngineArgs`` fields and their ``vllm serve`` flags.

The parent process never imports vLLM (only the trial worker does), so the description comes from
``python -m autotune.trial.worker --describe`` once and is cached per vLLM installation.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune._logging import get_logger
from autotune.atomic import write_text_atomic
from autotune.errors import EngineError
from autotune.trial.installed import installed_distribution

_logger = get_logger(__name__)


@dataclass(frozen=True)
class ArgInfo:
    """One ``EngineArgs`` field. ``kind`` is ``bool``, ``int``, ``float``, ``str`` or ``other``."""

    name: str
    kind: str
    default: Any = None
    flags: tuple[str, ...] = ()
    boolean_optional: bool = False
    store_true: bool = False
    choices: tuple[Any, ...] | None = None
    nargs: str | int | None = None


@dataclass(frozen=True)
class EngineInfo:
    """The installed vLLM as the tuner needs to know it."""

    vllm_version: str
    distribution: str
    platform: str
    args: dict[str, ArgInfo] = field(default_factory=dict)
    #: defaults vLLM resolves on this machine where the field's own default is None
    platform_defaults: dict[str, Any] = field(default_factory=dict)

    def default(self, name: str) -> Any:
        """What ``name`` is when a config leaves it unset (None where vLLM decides it later)."""
        if name in self.platform_defaults:
            return self.platform_defaults[name]
        arg = self.args.get(name)
        return arg.default if arg is not None else None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineInfo:
        args = {}
        for name, a in data["args"].items():
            choices = a.get("choices")
            args[name] = ArgInfo(
                name=name,
                kind=a["kind"],
                default=a.get("default"),
                flags=tuple(a.get("flags", ())),
                boolean_optional=bool(a.get("boolean_optional")),
                store_true=bool(a.get("store_true")),
                choices=tuple(choices) if choices is not None else None,
                nargs=a.get("nargs"),
            )
        return cls(
            data["vllm_version"],
            data["distribution"],
            data["platform"],
            args,
            dict(data.get("defaults") or {}),
        )


def _cache_path(dist: str, version: str) -> Path:
    """Per installation and GPU model (vLLM's batch defaults depend on the GPU's memory), and per
    version of what the describe worker reports (the last number)."""
    from autotune.trial.telemetry import gpu_names, visible_device_ids

    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm-autotune"
    gpus = ",".join(sorted(set(gpu_names(visible_device_ids()))))
    key = hashlib.sha256(f"{sys.executable}|{dist}|{version}|{gpus}|3".encode()).hexdigest()[:12]
    return root / f"engine-{dist}-{version}-{key}.json"


def describe_engine(*, use_cache: bool = True, timeout_s: float = 300.0) -> EngineInfo:
    """Describe the installed vLLM, from the cache when it was described before."""
    dist, version = installed_distribution()
    cache = _cache_path(dist, version)
    if use_cache and cache.is_file():
        try:
            return EngineInfo.from_dict(json.loads(cache.read_text()))
        except (ValueError, KeyError, TypeError):
            _logger.debug("ignoring unreadable engine description cache %s", cache)
    _logger.info("reading the engine arguments of %s %s (once per installation)", dist, version)
    command = [sys.executable, "-m", "autotune.trial.worker", "--describe"]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise EngineError(
            f"reading vLLM's engine arguments ({dist} {version}) did not answer within "
            f"{timeout_s:g} s: `{' '.join(command[1:])}` hangs importing vLLM; run it by hand to "
            "see where (a stale lock in ~/.cache, an unreachable model hub without HF_HUB_OFFLINE=1)"
        ) from None
    from autotune.trial.protocol import parse

    event = next((e for e in parse(proc.stdout.splitlines()) if e["event"] == "describe"), None)
    if proc.returncode != 0 or event is None:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise EngineError(f"could not read vLLM's engine arguments ({dist} {version}):\n{tail}")
    data = event["info"]
    try:
        write_text_atomic(cache, json.dumps(data))
    except OSError as e:
        _logger.debug("could not cache the engine description: %s", e)
    return EngineInfo.from_dict(data)
