"""Orchestrate a run: check the inputs, open the study, run its budget, summarise.

The steps, each its own function: :func:`~autotune.tuning.inputs.check_inputs` (nothing is
written before it passes), :func:`~autotune.tuning.session.open_session` (the storage, the study
created or resumed, its settings reconciled with the command line, cut-off trials recovered, the
budget set), :func:`optimize` (Optuna's loop with the objective, the progress display and the
stopping rules).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna

from autotune._logging import get_logger
from autotune.analysis.quality import quality_of
from autotune.analysis.verdict import Verdict, study_verdict
from autotune.errors import StudyError
from autotune.study.budget import counted_trials
from autotune.study.lock import study_lock
from autotune.study.recovery import (
    finished_elsewhere,
    wait_for_other_workers,
)
from autotune.study.storage import GRACE_HEARTBEATS, redact
from autotune.study.trials import baseline_failure_message, failed_baseline, summary
from autotune.trial.forkserver import WarmWorkers
from autotune.trial.process import stop_requests
from autotune.trial.record import TrialRecord
from autotune.trial.workload import WorkloadSpec
from autotune.tuning.inputs import RunInputs, check_inputs
from autotune.tuning.objective import Objective, TrialFailed
from autotune.tuning.progress import SHORT_MEASUREMENT_S, Progress
from autotune.tuning.request import RunRequest
from autotune.tuning.session import Session, open_session
from autotune.tuning.stopping import StopReason, StopRules
from autotune.tuning.validate import ValidationObjective, validate

_logger = get_logger(__name__)


def run_study(req: RunRequest) -> dict[str, Any]:
    """Run study ``req.study`` (created when new) up to its budget; return a summary."""
    inputs = check_inputs(req)
    try:  # trial logs go here whatever the storage; the default SQLite file too
        req.studies_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StudyError(
            f"--studies-dir {req.studies_dir}: cannot create it ({e.strerror or e}); "
            "choose a writable directory"
        ) from None
    with _lock(inputs), _warm_workers(req) as warm:
        session = open_session(req, inputs)
        finished = req.validate_only or optimize(req, inputs, session, warm)
        verdict = None
        if len(session.settings.values) > 1 and req.validate_rounds > 0:
            _logger.info(
                "a Pareto study is not validated in rounds (a verdict judges one objective): each front "
                "point is one measurement; `autotune export --trial N` exports any of them"
            )
        elif finished and req.validate_rounds > 0:
            verdict = validate_session(req, inputs, session, warm)
        elif req.validate_rounds > 0:
            _logger.info("the search is not finished: no validation yet (the same command resumes both)")
        out = summary(session.study)
        out["validation"] = verdict.to_dict() if verdict is not None else _previous(session.study)
        out["quality"] = _winner_quality(session, out)
        return out


def _winner_quality(session: Session, out: dict[str, Any]) -> dict[str, Any] | None:
    """The quality statement of the config the run recommends (the validated winner, else the best)."""
    validation = out["validation"]
    winner = validation.get("winner") if validation.get("rounds") else (out.get("best") or {}).get("trial")
    if winner is None:
        return None
    record = TrialRecord.of(session.study.trials[int(winner)])
    return quality_of(record, session.settings.quality_budget, session.settings.fixed)


def _previous(study: optuna.Study) -> dict[str, Any]:
    verdict = study_verdict(study)
    return verdict.to_dict() if verdict is not None else {"status": "not validated"}


@contextlib.contextmanager
def _warm_workers(req: RunRequest) -> Iterator[WarmWorkers | None]:
    """The run's warm workers (their logs in the studies dir), ended with the run."""
    warm = WarmWorkers(req.studies_dir) if req.warm_workers else None
    try:
        yield warm
    finally:
        if warm is not None:
            warm.close()


def _measuring(req: RunRequest, inputs: RunInputs, s: Session, warm: WarmWorkers | None) -> dict[str, Any]:
    """The :class:`~autotune.tuning.measure.Measuring` fields of this run's objectives."""
    return {
        "settings": s.settings,
        "study_dir": s.study_dir,
        "timeout_s": req.trial_timeout_s,
        "pool": inputs.pool,
        "requests_file": s.requests_file,
        "env": {**vllm_cache_env(req, s.study_dir), **req.env},
        "warm": warm,
        "engine": inputs.engine,
    }


def vllm_cache_env(req: RunRequest, study_dir: Path) -> dict[str, str]:
    """The trials' ``VLLM_CACHE_ROOT``: ``--vllm-cache``, else the user's own where set, else a
    cache the study owns beside its trial dirs. vLLM keeps its torch.compile artifacts there, so
    a trial whose config compiles as an earlier one did loads them instead of compiling again,
    and a study resumed on a fresh machine can bring its cache along (copy the dir)."""
    if req.vllm_cache is not None:
        return {"VLLM_CACHE_ROOT": str(req.vllm_cache.expanduser().resolve())}
    if os.environ.get("VLLM_CACHE_ROOT"):
        return {}
    return {"VLLM_CACHE_ROOT": str((study_dir / "vllm-cache").resolve())}


def validate_session(
    req: RunRequest, inputs: RunInputs, s: Session, warm: WarmWorkers | None = None
) -> Verdict | None:
    """The validation rounds of an open study (see :mod:`autotune.tuning.validate`)."""
    objective = ValidationObjective(search=s.study, **_measuring(req, inputs, s, warm))
    stop_requests.reset()
    callbacks = []
    if req.time_budget_s is not None:  # the search's rules, counting nothing but time
        callbacks.append(
            StopRules(budget=2**31, time_budget_s=req.time_budget_s, parallel=len(inputs.pool.slots))
        )
    return validate(
        s.study,
        s.study._storage,
        objective,
        top=req.validate_top,
        rounds=req.validate_rounds,
        seed=s.settings.seed,
        sole_worker=s.sole_worker,
        callbacks=callbacks,
    )


@contextlib.contextmanager
def _lock(inputs: RunInputs) -> Iterator[None]:
    """One run at a time on a SQLite study; server storages need no lock (heartbeats instead)."""
    db = inputs.sqlite_file
    if db is None:
        yield
        return
    with study_lock(db.with_suffix(".lock"), inputs.name):
        yield


def _announce(inputs: RunInputs, s: Session, counted: int) -> None:
    elsewhere = len(s.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))
    engine = inputs.engine
    _logger.info(
        "%s study %r (%s) on %s %s [%s]: %d of %d trials done%s, %d to run",
        "new" if s.created else "resuming",
        inputs.name,
        redact(inputs.url),
        engine.distribution,
        engine.vllm_version,
        engine.platform,
        counted - elsewhere,
        s.total,
        f" and {elsewhere} running on other workers" if elsewhere else "",
        max(0, s.total - counted),
    )
    _logger.info(
        "model %s | workload %s | searching %s",
        s.settings.model,
        WorkloadSpec(**s.settings.workload).describe(),
        ", ".join(f"{p.name} {p.describe()}" for p in s.space.parameters) or "nothing",
    )
    if s.space.fixed:
        _logger.info("fixed for every trial: %s", s.space.fixed)


def optimize(req: RunRequest, inputs: RunInputs, s: Session, warm: WarmWorkers | None = None) -> bool:
    """Run trials until the budget is used up or a stopping rule fires.

    Returns:
        Whether the search is finished: its budget used up, or converged (not stopped for time).
    """
    study, slots = s.study, inputs.pool.slots
    counted = counted_trials(study)
    _announce(inputs, s, counted)
    # a live worker's trial ends within its timeout; one of a worker that died before its first
    # heartbeat never goes stale: wait for other workers' trials at most this long
    grace_s = GRACE_HEARTBEATS * s.heartbeat_s
    max_wait = req.trial_timeout_s + grace_s + 60

    def budget_left() -> bool:
        return wait_for_other_workers(study, s.total, s.heartbeat_s, grace_s, max_wait_s=max_wait)

    if counted >= s.total and (s.sole_worker or not budget_left()):
        _logger.info(
            "study %r has all %d of its trials; pass --trials M (the total, M > %d) to run more",
            inputs.name,
            s.total,
            s.total,
        )
        return True
    started = time.time()
    rules = StopRules(
        budget=s.total,
        time_budget_s=req.time_budget_s,
        earlier_walls=[w for t in study.get_trials(deepcopy=False) if (w := TrialRecord.of(t).wall_s)],
        parallel=len(slots),
        started=started,
    )
    progress = Progress(
        budget=s.total,
        counted_at_start=counted,
        objective=s.settings.objective,
        show_bar=req.show_bar,
        started=started,
        short_measurement_s=SHORT_MEASUREMENT_S if req.warn_short_measurement else None,
        parallel=len(slots),
        others=tuple(s.settings.values[1:]),
    )
    objective = Objective(
        space=s.space,
        budget=s.total,
        on_phase=progress.phase,
        informed_start=req.informed_start,
        # Optuna's pruners (and trial.report) take one objective
        early_stop=req.early_stop and len(s.settings.values) == 1,
        engine_args=frozenset(inputs.engine.args),
        **_measuring(req, inputs, s, warm),
    )
    if len(slots) > 1:
        _logger.info("%d trials at a time, on GPUs %s", len(slots), " | ".join(sl.describe() for sl in slots))
    stop_requests.reset()
    try:
        while True:
            try:
                study.optimize(
                    objective,
                    n_trials=None,
                    n_jobs=len(slots),
                    callbacks=[progress, rules],
                    catch=(TrialFailed,),
                )
            except (ValueError, optuna.exceptions.UpdateFinishedTrialError) as e:
                if not finished_elsewhere(e):
                    raise
                # another worker's heartbeat check failed a trial that was alive (a database
                # outage stopped its heartbeats): its config runs again there; go on
                _logger.warning("a trial of this worker was failed by another worker (%s); going on", e)
                if rules.reason in (None, StopReason.BUDGET):
                    continue
            if rules.reason not in (None, StopReason.BUDGET):
                break
            if not budget_left():  # a retry may have freed budget; other workers may still run
                break
    finally:
        progress.close()
    if (failed := failed_baseline(study)) is not None:
        raise StudyError(baseline_failure_message(study, failed))
    if rules.stopped_for_skips:
        raise StudyError(
            f"the last {rules.max_consecutive_skips} configs proposed all broke a constraint "
            "of the space; the constraints rule out (nearly) the whole space: loosen them or "
            "the parameter ranges"
        )
    return rules.reason is not StopReason.TIME
