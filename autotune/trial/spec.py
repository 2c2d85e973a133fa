"""What a worker is asked to run: one config on one workload, serialised to ``spec.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: how every request samples (``ignore_eos``: each generates exactly its output length)
DEFAULT_SAMPLING = {"temperature": 0.8, "top_p": 0.95}


@dataclass(frozen=True)
class TrialSpec:
    """Everything a worker needs to run one config; serialised to the trial's ``spec.json``."""

    trial_dir: Path
    engine_kwargs: dict[str, Any]
    workload: dict[str, Any]
    requests_file: str | None = None
    sampling: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_SAMPLING))
    warmup_requests: int = 16
    timeout_s: float = 1200.0
    env: dict[str, str] = field(default_factory=dict)
    device_ids: list[int] = field(default_factory=list)
    #: the quality probe's settings (see :mod:`autotune.trial.probe`): None runs no probe;
    #: ``{"reference": PATH}`` scores the sequences of that ``probe.json``; without a reference
    #: (the baseline) it makes them, its prompts cut to fit ``max_len`` tokens with the continuation
    probe: dict[str, Any] | None = None
    #: serve mode (None: offline ``LLM.generate``): ``server_args`` (the config as server flags),
    #: ``concurrency``, ``request_rate``, ``port`` (where the slot's free-port scan starts); see
    #: :mod:`autotune.trial.serve_worker`
    serve: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["trial_dir"] = str(self.trial_dir)
        return d
