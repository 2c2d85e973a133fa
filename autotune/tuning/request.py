"""What ``autotune run`` (or ``autotune demo``) was asked to do."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunRequest:
    """A run's inputs as given; None means "the study's stored value, or the default"."""

    study: str
    trials: int | None = None
    storage: str | None = None
    studies_dir: Path = Path("studies")
    model: str | None = None
    workload: str | None = None
    space: str | None = None
    objective: str | None = None
    trial_timeout_s: float = 1800.0
    fixed: dict[str, Any] = field(default_factory=dict)
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    seed: int = 0
    time_budget_s: float | None = None
    show_bar: bool = False
    env: dict[str, str] = field(default_factory=dict)
    gpus: list[int] | None = None
    gpus_per_trial: int | None = None
    heartbeat_s: int | None = None  # None: the study's stored one (a new study: 30 s)
    warn_short_measurement: bool = True
    #: validation after the search: the best configs measured again (0 rounds: none)
    validate_top: int = 3
    validate_rounds: int = 3
    #: ``autotune validate``: no search, only the validation rounds of an existing study
    validate_only: bool = False
    #: the quality guard: None is the study's stored budget (a new study: the default)
    quality_budget: float | None = None
    #: ``--no-quality-check``: a new study measures speed only (dummy weights)
    quality_check: bool = True
    #: fork trials from a warm worker that imported vLLM once (``--cold-workers``: each trial a
    #: fresh interpreter)
    warm_workers: bool = True
    #: once the baseline has run, measure the configs it informs first (``--no-informed-start``:
    #: the sampler's own start-up only)
    informed_start: bool = True
    #: let the study's pruner stop a sampled trial that is behind at the same share of the work
    #: (``--no-early-stop``: every trial runs whole)
    early_stop: bool = True
    #: ``offline`` (time ``LLM.generate``) or ``serve`` (a server under load); None: the study's
    #: stored mode (a new study: offline)
    mode: str | None = None
    #: serve mode's load: clients at once, and requests per second (None: all at once)
    concurrency: int | None = None
    request_rate: float | None = None
    #: serve mode's latency bounds (``autotune.study.slo``); None: the study's stored ones
    slos: dict[str, float] | None = None
    #: a Pareto study's metrics (``--objectives``, parsed); None: the study's stored ones
    objectives: list[str] | None = None
    #: vLLM's cache root (``VLLM_CACHE_ROOT``: torch.compile artifacts) for every trial; None:
    #: the user's ``$VLLM_CACHE_ROOT`` where set, else ``<studies dir>/<study>/vllm-cache``
    vllm_cache: Path | None = None
