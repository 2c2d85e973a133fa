"""What a study stores about itself (its user attributes): the settings fixed when it was
created, so a resume runs the same benchmark the first run did, its trial budget and the
heartbeat interval every worker judges by."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.errors import StudyError
from autotune.trial.spec import DEFAULT_SAMPLING

if TYPE_CHECKING:
    import optuna

    from autotune.study.objectives import Direction

#: Metrics a study may maximise; every trial reports all of them.
OBJECTIVES = ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s")
DEFAULT_WORKLOAD = "synthetic:count=1000,input_len=256,output_len=256"
DEFAULT_TRIALS = 30
#: the largest mean KL divergence (nats per token) from the baseline's next-token distributions
#: that a config may show and still win (see autotune.trial.probe). Chosen from SmolLM2-135M on
#: the H200 (benchmarks/results/h200-2026-12-04-quality/): bf16 -> fp16 0.0008, fp8 KV cache 0.011,
#: fp8 weights 0.025, both 0.041; 0.02 admits an fp8 KV cache and refuses fp8 weights there (a
#: small model drifts more than a large one: on a 7B the same knobs measure lower)
DEFAULT_QUALITY_BUDGET = 0.02

SETTINGS_ATTR = "autotune"
BUDGET_ATTR = "autotune_budget"
#: the study's heartbeat interval: every worker must judge staleness alike
HEARTBEAT_ATTR = "autotune_heartbeat_s"


@dataclass(frozen=True)
class StudySettings:
    """What a study measures. Stored as the study's ``autotune`` user attribute."""

    model: str
    workload: dict[str, Any]
    space: dict[str, Any]
    objective: str = "output_tokens_per_s"
    sampling: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_SAMPLING))
    seed: int = 0
    warmup_requests: int = 16
    vllm_version: str = ""
    distribution: str = ""
    platform: str = ""
    gpus: list[str] = field(default_factory=list)
    #: the quality guard's budget (mean KL, nats); None: the guard is off (a study from before
    #: it existed, or ``--no-quality-check``)
    quality_budget: float | None = None
    #: ``offline`` (``LLM.generate`` over the workload) or ``serve`` (vLLM's server under load)
    mode: str = "offline"
    #: serve mode's load: ``{"concurrency": N | None, "request_rate": R | None}``
    load: dict[str, Any] = field(default_factory=dict)
    #: serve mode's latency bounds, ms (see :mod:`autotune.study.slo`)
    slos: dict[str, float] = field(default_factory=dict)
    #: a multi-objective study's metrics, in order (see :mod:`autotune.study.objectives`); empty:
    #: ``objective`` alone
    objectives: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudySettings:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def values(self) -> list[str]:
        """The metrics each trial's values are, in order."""
        return list(self.objectives) or [self.objective]

    @property
    def directions(self) -> list[Direction]:
        from autotune.study.objectives import direction

        return [direction(n) for n in self.values]

    @property
    def fixed(self) -> dict[str, Any]:
        return dict(self.space.get("fixed", {}))


def is_autotune_study(study: optuna.Study) -> bool:
    return isinstance(study.user_attrs.get(SETTINGS_ATTR), dict)


def stored_settings(study: optuna.Study) -> StudySettings:
    """The settings the study was created with.

    Raises:
        StudyError: the study was not made by vllm-autotune.
    """
    raw = study.user_attrs.get(SETTINGS_ATTR)
    if not isinstance(raw, dict):
        raise StudyError(
            f"study {study.study_name!r} exists but was not made by vllm-autotune (no settings stored)"
        )
    return StudySettings.from_dict(raw)


def raw_settings(study: optuna.Study) -> dict[str, Any]:
    """The stored settings as they are (``{}`` for a study vllm-autotune did not make)."""
    raw = study.user_attrs.get(SETTINGS_ATTR)
    return raw if isinstance(raw, dict) else {}


def budget(study: optuna.Study) -> int:
    """The study's trial budget; a study written before budgets were stored gets the default."""
    return int(study.user_attrs.get(BUDGET_ATTR, DEFAULT_TRIALS))


def stored_heartbeat(study: optuna.Study) -> int | None:
    value = study.user_attrs.get(HEARTBEAT_ATTR)
    return int(value) if value is not None else None
