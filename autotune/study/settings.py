"""The settings of a study, fixed when it is created and stored with it, so a resume runs the
same benchmark the first run did."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: Metrics a study may maximise; every trial reports all of them.
OBJECTIVES = ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s")
DEFAULT_SAMPLING = {"temperature": 0.8, "top_p": 0.95}


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudySettings:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def fixed(self) -> dict[str, Any]:
        return dict(self.space.get("fixed", {}))
