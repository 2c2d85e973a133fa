"""One measurement of one config on an Optuna trial: the spec, the isolated run, the record,
and the value (or the pruned / failed state). The search's objective and the validation
rounds' both measure through here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autotune.space.lossy import lossy_changes
from autotune.study.recovery import queue_retry
from autotune.study.settings import StudySettings
from autotune.trial.record import INFEASIBLE, Outcome, Role, TrialRecord, mark
from autotune.trial.runner import run_trial
from autotune.trial.spec import TrialSpec
from autotune.tuning import quality
from autotune.tuning.placement import Slot, SlotPool


class TrialFailed(Exception):
    """A trial crashed or timed out; the study records it as FAIL and goes on (control flow)."""


def trial_spec(
    settings: StudySettings,
    engine_kwargs: dict[str, Any],
    trial_dir: Path,
    slot: Slot,
    *,
    timeout_s: float,
    requests_file: str | None,
    env: dict[str, str],
    probe: dict[str, Any] | None = None,
) -> TrialSpec:
    return TrialSpec(
        trial_dir=trial_dir,
        engine_kwargs=engine_kwargs,
        workload=settings.workload,
        requests_file=requests_file,
        sampling=settings.sampling,
        warmup_requests=settings.warmup_requests,
        timeout_s=timeout_s,
        env={**env, **slot.env},
        device_ids=list(slot.device_ids),
        probe=probe,
    )


def measure(
    trial: optuna.Trial, spec: TrialSpec, on_phase: Callable[[int, str | None], None] | None = None
) -> TrialRecord:
    """Run ``spec`` for ``trial`` and store how it went on the trial.

    Ctrl-C (or SIGTERM) ends the trial's process group (the runner), marks the trial interrupted
    and queues its config again, here, by the one worker it belonged to (two workers starting
    later could both), then lets the interrupt go on.
    """
    try:
        if on_phase is None:
            result = run_trial(spec)
        else:
            result = run_trial(spec, on_phase=lambda phase: on_phase(trial.number, phase))
    except KeyboardInterrupt:
        mark(trial, Outcome.INTERRUPTED, "interrupted by the user (Ctrl-C / SIGTERM)")
        queue_retry(trial.study, trial, Outcome.INTERRUPTED.value)
        raise
    finally:
        if on_phase is not None:
            on_phase(trial.number, None)
    # recorded before anything else: a trial another worker failed meanwhile (a stale heartbeat,
    # queued again there) raises here; trial_dir, engine_kwargs and gpus are stored already
    dataclasses.replace(result, trial_dir=None, engine_kwargs=None, gpus=()).write(trial)
    return result


def value_of(result: TrialRecord, objective: str) -> float:
    """The trial's value; out of memory, an invalid config or outputs that drift beyond the quality
    budget prune it (the sampler learns to avoid the region), a timeout or crash fails it."""
    if result.outcome is Outcome.SUCCESS:
        return float(result.metrics[objective])
    if result.outcome in INFEASIBLE:
        raise optuna.TrialPruned(f"{result.error_type}: {result.error}")
    raise TrialFailed(f"{result.error_type}: {result.error} (log: {result.log})")


@dataclass(kw_only=True)
class Measuring:
    """What every objective needs to measure a config: the study's settings, where trials keep
    their directories, the timeout, the GPU slots, the workload's file, the environment, and who
    is told of each trial's phases."""

    settings: StudySettings
    study_dir: Path
    timeout_s: float
    pool: SlotPool = field(default_factory=lambda: SlotPool([Slot(0, ())]))
    requests_file: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: told ``(trial number, phase)`` as a running trial's worker enters each phase, and
    #: ``(trial number, None)`` once its process is gone
    on_phase: Callable[[int, str | None], None] | None = None
    #: judge each trial's outputs against the baseline's (the study's quality budget; the
    #: search does, validation rounds measure speed only)
    quality_guard: bool = False

    def measure(
        self, trial: optuna.Trial, engine_kwargs: dict[str, Any], trial_dir: Path, slot: Slot
    ) -> TrialRecord:
        """Run ``engine_kwargs`` for ``trial`` in ``slot`` (see :func:`measure`)."""
        budget = self.settings.quality_budget if self.quality_guard else None
        probe, ref = quality.plan(trial, wait_s=self.timeout_s) if budget is not None else (None, None)
        spec = trial_spec(
            self.settings,
            engine_kwargs,
            trial_dir,
            slot,
            timeout_s=self.timeout_s,
            requests_file=self.requests_file,
            env=self.env,
            probe=probe,
        )
        result = measure(trial, spec, self.on_phase)
        if budget is None or TrialRecord.of(trial).role is Role.BASELINE:
            return result
        judged = quality.judge(result, ref, budget, lossy_changes(engine_kwargs, self.settings.fixed))
        if judged != result:
            fields = ("outcome", "error_type", "error", "quality")
            TrialRecord(**{f: getattr(judged, f) for f in fields}).write(trial)
            judged.write_json(trial_dir / "result.json")
        return judged


def start(trial: optuna.Trial, trial_dir: Path, engine_kwargs: dict[str, Any]) -> None:
    """What a trial will run, stored before it runs."""
    TrialRecord(trial_dir=str(trial_dir), engine_kwargs=engine_kwargs).write(trial)


def record_slot(trial: optuna.Trial, slot: Slot) -> None:
    """The GPUs a trial runs on, stored before it runs: a trial cut off still says where it ran."""
    if slot.device_ids:
        TrialRecord(gpus=slot.device_ids).write(trial)
