"""The Optuna objective: suggest a config, check it, run it in isolation, classify the result.

Outcomes map onto Optuna states in this one place: success -> COMPLETE with the objective
value; out of memory or a config vLLM rejects -> PRUNED (TPE ranks pruned trials worst, so it
learns to avoid the region); timeout or crash -> FAIL, with the error and the log path stored.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autotune._logging import get_logger
from autotune.space.constraints import violations
from autotune.space.spec import SearchSpace
from autotune.study.budget import counted_trials, over_budget
from autotune.study.lifecycle import enqueue_config
from autotune.study.recovery import queue_back, queue_retry
from autotune.study.slo import copy_constraints, set_constraints
from autotune.study.trials import find_duplicate
from autotune.trial.outcome import engine_start_s
from autotune.trial.record import Outcome, Role, TrialRecord, mark
from autotune.trial.runner import write_skipped
from autotune.tuning.informed import informed_configs
from autotune.tuning.measure import Measuring, TrialFailed, record_slot, start, value_of
from autotune.tuning.placement import Slot
from autotune.tuning.resolved import record_resolved

_logger = get_logger(__name__)

COLD_RETRY_REASON = "timed out in the run's first, cold engine start"


class OverBudget(TrialFailed):
    """Another worker used the study's last trial first; this one is recorded, uncounted, unrun."""


@dataclass(kw_only=True)
class Objective(Measuring):
    """Callable for ``study.optimize``; one call runs one trial end to end."""

    space: SearchSpace
    budget: int | None = None
    quality_guard: bool = True
    early_stop: bool = True
    #: queue informed start-up configs once the baseline has run (see :mod:`autotune.tuning.informed`)
    informed_start: bool = True
    #: the installed vLLM's engine argument names
    engine_args: frozenset[str] = frozenset()
    # set once a trial of this run got its engine up: vLLM's compile and CUDA-graph caches exist
    _warm: bool = field(default=False, init=False, repr=False)
    _cold_retries: int = field(default=0, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.probe_max_len is None:
            self.probe_max_len = self.space.smallest("max_model_len")

    def config_for(self, trial: optuna.Trial) -> dict[str, Any]:
        """The engine args this trial runs with (the fixed ones included)."""
        record = TrialRecord.of(trial)
        if record.role is Role.BASELINE:
            params: dict[str, Any] = {}
        elif record.role in (Role.ENQUEUED, Role.INFORMED):
            # exactly what the user gave (or the baseline informed), vLLM's defaults for the rest:
            # a hand-tuned config is measured as written; its searched keys are the trial's params
            params = dict(record.config or {})
            for p in self.space.parameters:
                if p.name in params and p.records(params[p.name]):  # else: as written, unrecorded
                    p.suggest(trial)
        else:
            params = self.space.suggest(trial)
        return {**self.space.fixed, **params}

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, ...]:
        config = self.config_for(trial)
        trial_dir = self.study_dir / "trials" / str(trial.number)
        engine_kwargs = {"model": self.settings.model, **config}
        start(trial, trial_dir, engine_kwargs)
        reasons = violations(config, self.space.constraints, gpus=self.pool.gpus_per_trial)
        if reasons:
            write_skipped(trial_dir, engine_kwargs, reasons).write(trial)
            raise optuna.TrialPruned("constraint: " + "; ".join(reasons))
        if not TrialRecord.of(trial).queued and (earlier := find_duplicate(trial.study, engine_kwargs)):
            # the sampler proposed a config measured already (discrete spaces late in a study):
            # answer with that measurement, as Optuna's FAQ advises, instead of a GPU trial; one
            # that could not be used (out of memory, invalid, over the quality budget) is pruned again
            TrialRecord(outcome=Outcome.DUPLICATE, duplicate_of=earlier.number).write(trial)
            copy_constraints(trial, earlier)
            if earlier.values is None:
                raise optuna.TrialPruned(f"same config as trial #{earlier.number}, which was pruned")
            return earlier.values[0] if len(earlier.values) == 1 else tuple(earlier.values)
        if self.budget is not None and over_budget(trial.study, trial, self.budget):
            self._give_back(trial)
        with self.pool.take() as slot:
            record_slot(trial, slot)
            return self._run(trial, engine_kwargs, trial_dir, slot)

    def _give_back(self, trial: optuna.Trial) -> None:
        """Record ``trial`` as over the budget, put a queued config back in the queue, stop."""
        mark(trial, Outcome.OVER_BUDGET, "the study's budget was used up by other workers first")
        if TrialRecord.of(trial).queued:  # it came from the queue (baseline, enqueued, retry)
            queue_back(trial.study, trial)

        with contextlib.suppress(RuntimeError):  # RuntimeError: not inside study.optimize
            trial.study.stop()
        raise OverBudget(f"trial #{trial.number} started after the budget of {self.budget} was used up")

    def _retry_cold(self, trial: optuna.Trial, result: TrialRecord) -> None:
        """Queue a timed-out trial once more if cold caches, not its config, used up its time.

        The first engine start on a machine compiles the model (torch.compile) and captures CUDA
        graphs; later starts read vLLM's caches and take a fraction of it (H200, Llama-3.2-1B:
        146 s cold, 27-41 s warm). A tight ``--trial-timeout`` would otherwise fail that first
        trial, the baseline usually, for good. So: a timeout that spent most of its time starting
        the engine, before any trial of this run got its engine up, runs again, once per slot
        per run and once per config.
        """
        start_s = engine_start_s(result.phases_s, result.wall_s)
        with self._lock:
            if (
                result.outcome is not Outcome.TIMEOUT
                or self._warm
                or self._cold_retries >= len(self.pool.slots)
                or TrialRecord.of(trial).retry_reason == COLD_RETRY_REASON
                or start_s < 0.5 * (result.wall_s or 0.0)
            ):
                return
            self._cold_retries += 1
        _logger.warning(
            "trial #%d timed out after %.0f s, %.0f s of them starting the engine: the first start "
            "on a machine compiles the model and captures CUDA graphs (later ones read the cache), "
            "so its config runs once more; if it times out again, raise --trial-timeout",
            trial.number,
            result.wall_s or 0.0,
            start_s,
        )
        queue_retry(trial.study, trial, COLD_RETRY_REASON)

    def _inform(self, trial: optuna.Trial, result: TrialRecord) -> None:
        """Queue the informed start-up configs once the baseline has measured (once a study), as
        many as the budget has room for beside the trials queued already."""
        study = trial.study
        trials = study.get_trials(deepcopy=False)
        if any(TrialRecord.of(t).role is Role.INFORMED for t in trials):
            return
        configs = informed_configs(result, self.space, self.engine_args)
        if self.budget is not None:
            waiting = sum(t.state is optuna.trial.TrialState.WAITING for t in trials)
            configs = configs[: max(0, self.budget - counted_trials(study) - waiting)]
        for name, config in configs:
            enqueue_config(study, config, self.space.parameters, role=Role.INFORMED)
            _logger.info("queued %s, informed by the baseline: %s", name, config)

    def _run(self, trial: optuna.Trial, engine_kwargs: dict[str, Any], trial_dir: Path, slot: Slot) -> float:
        result = self.measure(trial, engine_kwargs, trial_dir, slot)
        if (
            self.informed_start
            and result.outcome is Outcome.SUCCESS
            and TrialRecord.of(trial).role is Role.BASELINE
        ):
            self._inform(trial, result)
        if self.settings.slos and result.outcome is Outcome.SUCCESS:
            # a config that misses an SLO is kept with its latencies; Optuna's best is feasible
            set_constraints(trial, result.metrics, self.settings.slos)
        self._retry_cold(trial, result)
        record_resolved(trial, self.space, result)  # a queued trial's unset params, for the sampler
        if "warmup" in result.phases_s:
            self._warm = True
        return value_of(result, self.settings.values)
