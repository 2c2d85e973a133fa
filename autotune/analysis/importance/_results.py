"""What an importance computation returns: rankings with their uncertainty and the models' scores."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

Status = Literal["ok", "too_few", "not_applicable", "error"]


@dataclass(frozen=True)
class ParamImportance:
    """One parameter's importance: the held-out score drop when it is permuted."""

    name: str
    mean: float
    std: float
    rank: int = 0
    constant: bool = False
    fanova: float | None = None
    fanova_rank: int | None = None


@dataclass(frozen=True)
class PairImportance:
    """Two parameters permuted together: what they explain jointly."""

    names: tuple[str, str]
    mean: float
    std: float


@dataclass(frozen=True)
class ModelImportance:
    """A surrogate's cross-validated score and its ranking of the parameters."""

    target: Literal["objective", "infeasible"]
    status: Status
    message: str
    n_trials: int = 0
    model: str = ""
    score_name: str = ""
    score_mean: float | None = None
    score_std: float | None = None
    trustworthy: bool = False
    params: tuple[ParamImportance, ...] = ()
    pairs: tuple[PairImportance, ...] = ()
    classes: dict[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    folds: int = 0
    repeats: int = 0

    def top(self, k: int = 1) -> list[str]:
        """Names of the ``k`` most important parameters (empty unless ``status`` is ok)."""
        return [p.name for p in self.params[:k]] if self.status == "ok" else []


@dataclass(frozen=True)
class FanovaResult:
    """Optuna's fANOVA on the same study: shares of the objective's variance per parameter."""

    status: Status
    message: str
    n_trials: int = 0
    shares: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportanceReport:
    """Everything ``autotune importance`` knows about a study; :meth:`to_dict` goes in exports."""

    study: str
    objective: str
    objective_model: ModelImportance
    feasibility_model: ModelImportance
    fanova: FanovaResult
    spearman_vs_fanova: float | None = None
    disagreements: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    method: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form, stored under ``importance`` in the export document."""
        return dict(_jsonable(asdict(self)))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return value
