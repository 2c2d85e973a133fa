"""One measurement of one config on an Optuna trial: the spec, the isolated run, the record,
and the value (or the pruned / failed state). The search's objective and the validation
rounds' both measure through here."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autotune._logging import get_logger
from autotune.space.engine_args import EngineInfo
from autotune.space.flags import serve_args
from autotune.space.lossy import lossy_changes
from autotune.study.recovery import queue_retry
from autotune.study.settings import StudySettings
from autotune.study.trials import baseline_trial
from autotune.trial.forkserver import WarmWorkers
from autotune.trial.probe import PROBE_FILE
from autotune.trial.record import CONSTRAINT, INFEASIBLE, Outcome, Role, TrialRecord, mark
from autotune.trial.runner import claim_dir, run_trial
from autotune.trial.spec import TrialSpec
from autotune.trial.telemetry import machine
from autotune.tuning import quality
from autotune.tuning.placement import Slot, SlotPool

_logger = get_logger(__name__)


class TrialFailed(Exception):
    """A trial crashed or timed out; the study records it as FAIL and goes on (control flow)."""


class Deferred(TrialFailed):
    """A lossy config came before the baseline's probe it must be judged by: recorded, uncounted,
    unrun, and queued again."""


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
    engine: EngineInfo | None = None,
) -> TrialSpec:
    serve = None
    if settings.mode == "serve":
        serve = {
            "server_args": serve_args(engine_kwargs, engine or EngineInfo("", "", "")),
            **settings.load,
            # two tuners on one host scan their slot's ports from different places
            "port": slot.serve_port + os.getpid() % 50,
        }
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
        serve=serve,
    )


def measure(
    trial: optuna.Trial,
    spec: TrialSpec,
    on_phase: Callable[[int, str | None], None] | None = None,
    judge: Callable[[TrialRecord], TrialRecord] | None = None,
    warm: WarmWorkers | None = None,
    progress: Progress | None = None,
) -> TrialRecord:
    """Run ``spec`` for ``trial`` and store how it went on the trial (as ``judge`` says, when
    given: the quality guard's verdict is part of the one record stored).

    Ctrl-C (or SIGTERM) ends the trial's process group (the runner), marks the trial interrupted
    and queues its config again, here, by the one worker it belonged to (two workers starting
    later could both), then lets the interrupt go on.
    """
    how: dict[str, Any] = {"warm": warm} if warm is not None else {}
    if on_phase is not None:
        how["on_phase"] = lambda phase: on_phase(trial.number, phase)
    if progress is not None:
        how.update(on_progress=progress.report, should_stop=progress.should_stop)
    try:
        result = run_trial(spec, **how)
    except KeyboardInterrupt:
        mark(trial, Outcome.INTERRUPTED, "interrupted by the user (Ctrl-C / SIGTERM)")
        queue_retry(trial.study, trial, Outcome.INTERRUPTED.value)
        raise
    finally:
        if on_phase is not None:
            on_phase(trial.number, None)
    if result.outcome is Outcome.INTERRUPTED:  # cut off by no fault of its own (its warm worker died)
        queue_retry(trial.study, trial, result.error or Outcome.INTERRUPTED.value)
    if judge is not None:
        judged = judge(result)
        if judged != result:
            judged.write_json(spec.trial_dir / "result.json")
        result = judged
    # recorded before anything else: a trial another worker failed meanwhile (a stale heartbeat,
    # queued again there) raises here; trial_dir, engine_kwargs and gpus are stored already
    dataclasses.replace(result, trial_dir=None, engine_kwargs=None, gpus=()).write(trial)
    return result


@dataclass
class Progress:
    """A trial's progress, told to Optuna as intermediate values, and its pruner's verdict.

    At each step (the percent of its requests finished) the trial reports an upper bound of its
    final value: the workload's ``work`` (the objective's units, e.g. output tokens, as the
    baseline measured them on the same requests) over the seconds its timed run has taken so far
    (see :mod:`autotune.study.pruning`). A ``stoppable`` trial the pruner says cannot keep up is
    stopped there; one whose requests have all finished never is.
    """

    trial: optuna.Trial
    stoppable: bool
    work: float
    _step: int = -1
    _stop: bool = False

    def report(self, share: float, elapsed_s: float) -> None:
        step = round(share * 100)
        if self._stop or step <= self._step or elapsed_s <= 0:
            return  # once stopped, the rest of a late batch of reports is moot
        self._step = step
        self.trial.report(self.work / elapsed_s, step)
        if self.stoppable and share < 1.0 and self.trial.should_prune():
            self._stop = True

    def should_stop(self) -> bool:
        return self._stop


def _work(study: optuna.Study, objective: str) -> float | None:
    """The workload's work in ``objective``'s units (output tokens, tokens, requests), as the
    baseline measured it: every trial runs the same requests."""
    base = baseline_trial(study)
    metrics = TrialRecord.of(base).metrics if base is not None else {}
    if not isinstance(metrics.get(objective), (int, float)) or not metrics.get("generate_s"):
        return None
    return float(metrics[objective]) * float(metrics["generate_s"])


def value_of(result: TrialRecord, objective: str | list[str]) -> Any:
    """The trial's value (a tuple of them for several objectives); out of memory, an invalid config
    or outputs that drift beyond the quality budget prune it (the sampler learns to avoid the
    region), a timeout or crash fails it."""
    if result.outcome is Outcome.SUCCESS:
        if isinstance(objective, list):
            values = tuple(float(result.metrics[n]) for n in objective)
            return values if len(values) > 1 else values[0]
        return float(result.metrics[objective])
    if result.outcome is Outcome.STOPPED:  # behind at the same share: what pruning is for
        raise optuna.TrialPruned(f"{result.error_type}: {result.error}")
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
    #: the least ``max_model_len`` a trial may run with: the baseline's probe fits it
    probe_max_len: int | None = None
    #: fork each trial's worker from a warm one that imported vLLM once (None: a fresh interpreter)
    warm: WarmWorkers | None = None
    #: tell Optuna each trial's progress (intermediate values), and let the study's pruner stop a
    #: sampled trial that is behind (the search does; validation rounds measure every config whole)
    early_stop: bool = False
    #: the installed vLLM's arguments (serve mode: the config as its server's flags)
    engine: EngineInfo | None = None

    def measure(
        self, trial: optuna.Trial, engine_kwargs: dict[str, Any], trial_dir: Path, slot: Slot
    ) -> TrialRecord:
        """Run ``engine_kwargs`` for ``trial`` in ``slot`` (see :func:`measure`), under the quality
        guard when it is on.

        Raises:
            Deferred: a lossy config, and the baseline's probe to judge it by does not exist yet.
        """
        budget = self.settings.quality_budget if self.quality_guard else None
        plan = None
        lossy = lossy_changes(engine_kwargs, self.settings.fixed)
        if budget is not None:
            plan = quality.plan(trial, self.study_dir, wait_s=self.timeout_s, max_len=self.probe_max_len)
            if plan.pending and lossy:
                self._defer(trial, lossy)
            if plan.reference_path is None and plan.probe is None and lossy:
                self._refuse(trial, trial_dir, engine_kwargs, lossy, plan.missing)
        spec = trial_spec(
            self.settings,
            engine_kwargs,
            trial_dir,
            slot,
            timeout_s=self.timeout_s,
            requests_file=self.requests_file,
            env=self.env,
            probe=plan.probe if plan is not None else None,
            engine=self.engine,
        )
        work = _work(trial.study, self.settings.objective) if self.early_stop else None
        progress = Progress(trial, not TrialRecord.of(trial).queued, work) if work else None
        if plan is None or budget is None:
            return measure(trial, spec, self.on_phase, warm=self.warm, progress=progress)
        if TrialRecord.of(trial).role is Role.BASELINE:
            result = measure(trial, spec, self.on_phase, warm=self.warm, progress=progress)
            if result.outcome is Outcome.SUCCESS and not quality.publish(
                trial.study, trial.number, trial_dir / PROBE_FILE
            ):
                _logger.warning(
                    "the baseline wrote no quality probe (%s): a config that changes outputs "
                    "cannot be judged in this study and is pruned",
                    result.quality.get("probe_error") or f"see {result.log}",
                )
            return result
        return measure(
            trial,
            spec,
            self.on_phase,
            lambda r: quality.judge(r, plan, budget, lossy),
            warm=self.warm,
            progress=progress,
        )

    @staticmethod
    def _refuse(
        trial: optuna.Trial, trial_dir: Path, engine_kwargs: dict[str, Any], lossy: list[str], why: str | None
    ) -> None:
        """A lossy config that could never be judged (no reference probe will exist): pruned
        unlaunched, uncounted, like a constraint's skip."""
        claim_dir(trial_dir)
        record = TrialRecord(
            outcome=Outcome.QUALITY,
            error_type=CONSTRAINT,
            error=f"{', '.join(lossy)} changes the model's outputs, and no reference probe exists to "
            f"judge it by: {why}; not run",
            engine_kwargs=engine_kwargs,
            trial_dir=str(trial_dir),
        )
        record.write_json(trial_dir / "result.json")
        dataclasses.replace(record, trial_dir=None, engine_kwargs=None).write(trial)
        raise optuna.TrialPruned(f"quality: {record.error}")

    @staticmethod
    def _defer(trial: optuna.Trial, lossy: list[str]) -> None:
        mark(
            trial,
            Outcome.DEFERRED,
            f"{', '.join(lossy)} changes outputs, and the baseline's probe to judge it by does not "
            "exist yet: queued again, to run once the baseline has finished",
        )
        queue_retry(trial.study, trial, quality.AWAITING_BASELINE)
        raise Deferred(f"trial #{trial.number} waits for the baseline")


def start(trial: optuna.Trial, trial_dir: Path, engine_kwargs: dict[str, Any]) -> None:
    """What a trial will run, stored before it runs."""
    TrialRecord(trial_dir=str(trial_dir), engine_kwargs=engine_kwargs).write(trial)


def record_slot(trial: optuna.Trial, slot: Slot) -> None:
    """The GPUs a trial runs on, stored before it runs: a trial cut off still says where it ran."""
    if slot.device_ids:
        TrialRecord(gpus=slot.device_ids, machine=machine(list(slot.device_ids))).write(trial)
