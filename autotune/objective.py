"""The Optuna objective: suggest a config, check it, run it in isolation, classify the result.

Outcomes map onto Optuna states in this one place: success -> COMPLETE with the objective
value; out of memory or a config vLLM rejects -> PRUNED (TPE ranks pruned trials worst, so it
learns to avoid the region); timeout or crash -> FAIL, with the error and the log path stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autotune._logging import get_logger
from autotune.config import StudySettings
from autotune.constraints import violations
from autotune.errors import AutotuneError
from autotune.outcome import Outcome
from autotune.runner import TrialSpec, run_trial, write_skipped
from autotune.search_space import SearchSpace
from autotune.study import CONFIG_ATTR, ROLE_ATTR

_logger = get_logger(__name__)


class TrialFailed(AutotuneError):
    """A trial crashed or timed out; the study records it as FAIL and goes on."""


@dataclass
class Objective:
    """Callable for ``study.optimize``; one call runs one trial end to end."""

    settings: StudySettings
    space: SearchSpace
    study_dir: Path
    timeout_s: float
    gpus: int = 1
    device_ids: list[int] = field(default_factory=list)
    requests_file: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def config_for(self, trial: optuna.Trial) -> dict[str, Any]:
        """The engine args this trial runs with (the fixed ones included)."""
        role = trial.user_attrs.get(ROLE_ATTR, "sampled")
        if role == "baseline":
            params: dict[str, Any] = {}
        elif role == "enqueued":
            # exactly what the user gave, vLLM's defaults for the rest: a hand-tuned config is
            # measured as written; its searched keys are recorded as the trial's params
            params = dict(trial.user_attrs.get(CONFIG_ATTR) or {})
            for p in self.space.parameters:
                if p.name in params:
                    p.suggest(trial)
        else:
            params = self.space.suggest(trial)
        return {**self.space.fixed, **params}

    def __call__(self, trial: optuna.Trial) -> float:
        config = self.config_for(trial)
        trial_dir = self.study_dir / "trials" / str(trial.number)
        trial.set_user_attr("trial_dir", str(trial_dir))
        trial.set_user_attr("engine_kwargs", {"model": self.settings.model, **config})
        reasons = violations(config, self.space.constraints, gpus=self.gpus)
        if reasons:
            write_skipped(trial_dir, config, reasons)
            trial.set_user_attr("outcome", Outcome.INVALID.value)
            trial.set_user_attr("error_type", "constraint")
            trial.set_user_attr("error", "; ".join(reasons))
            raise optuna.TrialPruned("constraint: " + "; ".join(reasons))

        spec = TrialSpec(
            trial_dir=trial_dir,
            engine_kwargs={"model": self.settings.model, **config},
            workload=self.settings.workload,
            requests_file=self.requests_file,
            sampling=self.settings.sampling,
            warmup_requests=self.settings.warmup_requests,
            timeout_s=self.timeout_s,
            env=self.env,
            device_ids=self.device_ids,
        )
        try:
            result = run_trial(spec)
        except KeyboardInterrupt:
            # the trial's process group is gone already (run_trial); the config gets retried
            trial.set_user_attr("outcome", "interrupted")
            trial.set_user_attr("error_type", "interrupted")
            trial.set_user_attr("error", "interrupted by the user (Ctrl-C / SIGTERM)")
            raise
        trial.set_user_attr("outcome", result.outcome.value)
        trial.set_user_attr("wall_s", result.wall_s)
        trial.set_user_attr("phases_s", result.phases)
        if result.engine:
            trial.set_user_attr("engine", result.engine)
        if result.outcome is Outcome.SUCCESS:
            trial.set_user_attr("metrics", result.metrics)
            return float(result.metrics[self.settings.objective])
        trial.set_user_attr("error_type", result.error_type)
        trial.set_user_attr("error", result.error)
        trial.set_user_attr("log", str(trial_dir / "stderr.log"))
        if result.outcome in (Outcome.OOM, Outcome.INVALID):
            raise optuna.TrialPruned(f"{result.error_type}: {result.error}")
        raise TrialFailed(f"{result.error_type}: {result.error} (log: {trial_dir / 'stderr.log'})")
