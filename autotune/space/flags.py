"""Engine kwargs as vLLM's server takes them: ``vllm serve`` flags, or a ``--config`` YAML.

Flag names come from the installed vLLM's own argument parser (:mod:`autotune.space.engine_args`);
booleans use its ``--x`` / ``--no-x`` pairs, lists its multi-value form, dicts JSON.
"""

from __future__ import annotations

import json
from typing import Any

from autotune.space.engine_args import EngineInfo


def _flag(name: str, engine: EngineInfo) -> str:
    info = engine.args.get(name)
    return info.flags[0] if info and info.flags else "--" + name.replace("_", "-")


def serve_args(kwargs: dict[str, Any], engine: EngineInfo) -> list[str]:
    """``vllm serve`` arguments (after the model) equivalent to engine ``kwargs``."""
    out: list[str] = []
    for name, value in kwargs.items():
        if name == "model" or value is None:
            continue
        info = engine.args.get(name)
        flag = _flag(name, engine)
        if isinstance(value, bool):
            if value:
                out.append(flag)
            elif info is not None and info.boolean_optional:
                out.append("--no-" + flag[2:])
            continue
        if isinstance(value, (list, tuple)) and info is not None and info.nargs in ("+", "*"):
            out += [flag, *map(str, value)]
        elif isinstance(value, (dict, list, tuple)):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            out += [flag, str(value)]
    return out


def serve_config(kwargs: dict[str, Any], engine: EngineInfo) -> dict[str, Any]:
    """Engine ``kwargs`` but the model as the mapping a ``vllm serve MODEL --config FILE`` YAML
    holds: its keys are the flags' names. vLLM turns ``key: false`` into ``--no-key`` where the
    flag has that form (else leaves the default, false), a list into the flag's values, a dict
    into the flag's JSON."""
    return {
        _flag(name, engine)[2:]: list(value) if isinstance(value, tuple) else value
        for name, value in kwargs.items()
        if name != "model" and value is not None
    }
