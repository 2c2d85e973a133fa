"""Orchestrate a run: open the study, resolve its settings, run the budget, summarise."""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autotune._logging import get_logger
from autotune.atomic import write_text_atomic
from autotune.errors import StudyError
from autotune.output.export import ratio
from autotune.space.constraints import check_feasible
from autotune.space.engine_args import EngineInfo, describe_engine
from autotune.space.load import SearchSpace, build_space, load_space
from autotune.study.lifecycle import (
    BUDGET_ATTR,
    DEFAULT_TRIALS,
    HEARTBEAT_ATTR,
    SETTINGS_ATTR,
    baseline_trial,
    best_trial,
    budget,
    counted_trials,
    create_or_resume,
    enqueue_config,
    fail_interrupted,
    load_existing,
    requeue_interrupted,
    retry_stale,
    stored_settings,
)
from autotune.study.lock import study_lock
from autotune.study.settings import StudySettings
from autotune.study.storage import (
    DEFAULT_HEARTBEAT_S,
    GRACE_HEARTBEATS,
    check_study_name,
    default_url,
    open_storage,
    redact,
)
from autotune.trial.model_ref import check_model
from autotune.trial.runner import stop_requests
from autotune.trial.telemetry import gpu_names, visible_device_ids
from autotune.trial.workload import WorkloadSpec, load_requests, parse_workload
from autotune.tuning.objective import Objective, TrialFailed
from autotune.tuning.placement import SlotPool, plan_slots
from autotune.tuning.progress import SHORT_MEASUREMENT_S, Progress

_logger = get_logger(__name__)
DEFAULT_WORKLOAD = "synthetic:count=1000,input_len=256,output_len=256"


@dataclass(frozen=True)
class RunRequest:
    """What ``autotune run`` was asked to do; None means "the study's stored value or default"."""

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


def _requests_file(study_dir: Path, wl: WorkloadSpec, *, fresh: bool) -> str | None:
    """Materialise a file workload once per study, so every trial reads the very same prompts."""
    if wl.kind == "synthetic":
        return None
    path = study_dir / "requests.jsonl"
    if fresh or not path.is_file():
        records = load_requests(wl)
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
        _logger.info("workload: %d requests from %s -> %s", len(records), wl.path, path)
    return str(path.resolve())


def run_study(req: RunRequest) -> dict[str, Any]:
    """Run ``req.trials`` trials of study ``req.study`` (created when new); return a summary."""
    name = check_study_name(req.study)
    studies_dir = req.studies_dir
    url = req.storage or default_url(name, studies_dir)
    engine = describe_engine()
    device_ids = visible_device_ids()
    pool = SlotPool(plan_slots(req.gpus, req.gpus_per_trial, visible=device_ids, platform=engine.platform))
    gpus = pool.gpus_per_trial  # what one trial may use: bounds tensor_parallel_size

    # check every input that was given before anything is written
    model = check_model(req.model) if req.model is not None else None
    given_wl = parse_workload(req.workload) if req.workload is not None else None
    if given_wl is not None and given_wl.kind != "synthetic":
        load_requests(given_wl)  # an empty or malformed file fails here
    given_space = load_space(req.space, engine, gpus=gpus, extra_fixed=req.fixed) if req.space else None
    if given_space is not None:
        check_feasible(given_space, gpus=gpus)
    if model is None and req.storage is None and not (studies_dir / f"{name}.db").is_file():
        raise StudyError(f"study {name!r} does not exist yet; give --model to create it")
    try:  # trial logs go here whatever the storage; the default SQLite file too
        studies_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StudyError(
            f"--studies-dir {studies_dir}: cannot create it ({e.strerror or e}); choose a writable directory"
        ) from None
    lock = (
        study_lock(Path(url.removeprefix("sqlite:///")).with_suffix(".lock"), name)
        if url.startswith("sqlite:///")
        else contextlib.nullcontext()
    )
    with lock:
        return _run_locked(req, name, url, engine, pool, model, given_wl, given_space)


def _run_locked(
    req: RunRequest,
    name: str,
    url: str,
    engine: EngineInfo,
    pool: SlotPool,
    model: str | None,
    given_wl: WorkloadSpec | None,
    given_space: SearchSpace | None,
) -> dict[str, Any]:
    studies_dir = req.studies_dir
    slots = pool.slots
    gpus = pool.gpus_per_trial
    device_ids = sorted({i for s in slots for i in s.device_ids})
    heartbeat_s = req.heartbeat_s or DEFAULT_HEARTBEAT_S
    storage = open_storage(url, heartbeat_s=heartbeat_s, on_stale=retry_stale)

    existing = load_existing(name, storage)
    stored_hb = existing.user_attrs.get(HEARTBEAT_ATTR) if existing is not None else None
    if stored_hb is not None and int(stored_hb) != heartbeat_s:
        # every worker must judge staleness alike, or one fails another's live trials
        if req.heartbeat_s is not None:
            _logger.warning(
                "study %r runs with --heartbeat %d (stored when it was created); ignoring %d",
                name,
                int(stored_hb),
                req.heartbeat_s,
            )
        heartbeat_s = int(stored_hb)
        storage = open_storage(url, heartbeat_s=heartbeat_s, on_stale=retry_stale)
        existing = load_existing(name, storage)
    settings: StudySettings | None = None
    if existing is None:
        if model is None:
            raise StudyError(f"study {name!r} does not exist yet; give --model to create it")
        wl = given_wl or parse_workload(DEFAULT_WORKLOAD)
        space = given_space or load_space(None, engine, gpus=gpus, extra_fixed=req.fixed)
        settings = StudySettings(
            model=model,
            workload=wl.to_dict(),
            space=space.to_dict(),
            objective=req.objective or "output_tokens_per_s",
            seed=req.seed,
            vllm_version=engine.vllm_version,
            distribution=engine.distribution,
            platform=engine.platform,
            gpus=gpu_names(device_ids) if engine.platform != "cpu" else [],
        )
    else:
        stored = stored_settings(existing)
        _check_resume(name, stored, req, model, given_wl)
        wl = WorkloadSpec(**stored.workload)
        if given_space is not None and given_space.fixed != stored.fixed:
            raise StudyError(
                f"study {name!r} fixes {stored.fixed}, --space {req.space} fixes {given_space.fixed}: "
                "that changes the benchmark under the baseline; start a new --study"
            )
        space = given_space or build_space(
            stored.space, engine, source=f"study {name}", gpus=gpus, name=stored.space.get("name", "stored")
        )

    # parallel workers of a shared study (never SQLite's: one run at a time) seed apart
    sole_worker = url.startswith("sqlite:")  # the SQLite lock is held: no other process runs it
    worker = 0 if sole_worker else os.getpid()
    study, settings, created = create_or_resume(name, storage, settings, worker=worker)
    if sole_worker:
        # whatever is RUNNING was cut off; requeueing is safe with no other process to double it
        # (elsewhere a trial cut off by Ctrl-C is queued again by its own worker, see Objective)
        for n in fail_interrupted(study, storage):
            _logger.warning("trial #%d was cut off by an earlier run that died; marked failed", n)
        for n in requeue_interrupted(study):
            _logger.info("trial #%d was interrupted: its config runs again", n)
    else:  # other workers may be running: only trials whose worker stopped beating are dead
        _fail_stale(study)
    # the budget lives in the study, shared by every worker: --trials N sets it to N (the same
    # command on each machine, or again after a crash, keeps it); a plain resume runs up to it
    total = req.trials or (DEFAULT_TRIALS if created else budget(study))
    if created or req.trials is not None:
        study.set_user_attr(BUDGET_ATTR, total)
    if created:
        study.set_user_attr(HEARTBEAT_ATTR, heartbeat_s)
    if req.trials is not None and not created and req.trials < (already := counted_trials(study)):
        _logger.warning(
            "--trials %d is the study's total budget, and it has %d trials already: nothing more "
            "runs; pass a larger --trials to extend it",
            req.trials,
            already,
        )
    if not created and req.space:
        study.set_user_attr(SETTINGS_ATTR, {**settings.to_dict(), "space": space.to_dict()})
    study_dir = studies_dir / name
    requests_file = _requests_file(study_dir, wl, fresh=created)
    for config in req.enqueue:
        enqueue_config(study, config, {p.name for p in space.parameters})
    for dropped in space.dropped:
        _logger.info("space: %s is not in this vLLM; dropped (optional)", dropped)

    counted = counted_trials(study)
    elsewhere = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))
    _logger.info(
        "%s study %r (%s) on %s %s [%s]: %d of %d trials done%s, %d to run",
        "new" if created else "resuming",
        name,
        redact(url),
        engine.distribution,
        engine.vllm_version,
        engine.platform,
        counted - elsewhere,
        total,
        f" and {elsewhere} running on other workers" if elsewhere else "",
        max(0, total - counted),
    )
    _logger.info(
        "model %s | workload %s | searching %s",
        settings.model,
        WorkloadSpec(**settings.workload).describe(),
        ", ".join(f"{p.name} {p.describe()}" for p in space.parameters) or "nothing",
    )
    if space.fixed:
        _logger.info("fixed for every trial: %s", space.fixed)

    objective = Objective(
        settings=settings,
        space=space,
        study_dir=study_dir,
        timeout_s=req.trial_timeout_s,
        pool=pool,
        requests_file=requests_file,
        env=req.env,
        budget=total,
    )
    # a live worker's trial ends within its timeout; one of a worker that died before its first
    # heartbeat never goes stale: wait for other workers' trials at most this long
    max_wait = req.trial_timeout_s + GRACE_HEARTBEATS * heartbeat_s + 60
    if counted >= total and (
        sole_worker or not _wait_for_other_workers(study, total, heartbeat_s, max_wait_s=max_wait)
    ):
        _logger.info(
            "study %r has all %d of its trials; pass --trials M (the total, M > %d) to run more",
            name,
            total,
            total,
        )
        return summarize(study)
    progress = Progress(
        budget=total,
        counted_at_start=counted,
        objective=settings.objective,
        show_bar=req.show_bar,
        time_budget_s=req.time_budget_s,
        earlier_walls=[
            float(t.user_attrs["wall_s"])
            for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get("wall_s")
        ],
        parallel=len(slots),
        short_measurement_s=SHORT_MEASUREMENT_S if req.warn_short_measurement else None,
    )
    if len(slots) > 1:
        _logger.info("%d trials at a time, on GPUs %s", len(slots), " | ".join(s.describe() for s in slots))
    stop_requests.reset()
    try:
        while True:
            try:
                study.optimize(
                    objective, n_trials=None, n_jobs=len(slots), callbacks=[progress], catch=(TrialFailed,)
                )
            except (ValueError, optuna.exceptions.UpdateFinishedTrialError) as e:
                if not _finished_elsewhere(e):
                    raise
                # another worker's heartbeat check failed a trial that was alive (a database
                # outage stopped its heartbeats): its config runs again there; go on
                _logger.warning("a trial of this worker was failed by another worker (%s); going on", e)
                continue
            if progress.stopped_for_skips or progress.stopped_for_time or progress.stopped_for_repeats:
                break
            if not _wait_for_other_workers(study, total, heartbeat_s, max_wait_s=max_wait):
                break
    finally:
        progress.close()
    if progress.stopped_for_skips:
        raise StudyError(
            f"the last {progress.max_consecutive_skips} configs proposed all broke a constraint "
            "of the space; the constraints rule out (nearly) the whole space: loosen them or "
            "the parameter ranges"
        )
    return summarize(study)


def _fail_stale(study: optuna.Study) -> None:
    """Fail the trials whose workers stopped sending heartbeats (``retry_stale`` requeues them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _finished_elsewhere(error: BaseException) -> bool:
    """Optuna refusing to record a trial because it is finished already (failed as stale)."""
    return isinstance(error, optuna.exceptions.UpdateFinishedTrialError) or "Cannot tell a" in str(error)


def _wait_for_other_workers(
    study: optuna.Study, total: int, heartbeat_s: float, *, max_wait_s: float
) -> bool:
    """The budget is used up, counting trials that other workers still run. Wait for those: a
    dead worker's trial goes stale, is failed and queued again (``retry_stale``), and then this
    worker runs it, so the budget is finished as long as one worker lives.

    Returns:
        True when budget came free (run more trials), False when every trial has ended (or
        ``max_wait_s`` passed: a resume later deals with what is left).
    """
    said = False
    deadline = time.monotonic() + max_wait_s
    while True:
        _fail_stale(study)
        if counted_trials(study) < total:
            return True
        running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        if not running:
            return False
        if time.monotonic() > deadline:
            _logger.warning(
                "trial(s) %s still RUNNING after %.0f s, longer than a trial may take here, and "
                "never stale (no heartbeat recorded): leaving them as they are",
                ", ".join(f"#{t.number}" for t in running),
                max_wait_s,
            )
            return False
        if not said:
            _logger.info(
                "budget of %d reached; waiting for trial(s) %s of other workers (a dead worker's "
                "trial is failed after %d s without heartbeat and then runs here)",
                total,
                ", ".join(f"#{t.number}" for t in running),
                GRACE_HEARTBEATS * heartbeat_s,
            )
            said = True
        time.sleep(max(1.0, heartbeat_s / 2))


def _check_resume(
    name: str, stored: StudySettings, req: RunRequest, model: str | None, wl: WorkloadSpec | None
) -> None:
    if model is not None and model != stored.model:
        raise StudyError(
            f"study {name!r} tunes model {stored.model!r}, not {req.model!r}; drop --model to "
            "resume it, or start a new --study"
        )
    if wl is not None and wl.to_dict() != stored.workload:
        raise StudyError(
            f"study {name!r} was created with another --workload ({stored.workload}); drop "
            "--workload to resume it, or start a new --study"
        )
    if req.objective is not None and req.objective != stored.objective:
        raise StudyError(
            f"study {name!r} maximises {stored.objective}; drop --objective or start a new --study"
        )
    changed = {k: v for k, v in req.fixed.items() if stored.fixed.get(k) != v}
    if changed:
        raise StudyError(
            f"study {name!r} fixes {stored.fixed}; --set {changed} would change the benchmark "
            "under the baseline: start a new --study"
        )


def summarize(study: optuna.Study) -> dict[str, Any]:
    """Best trial, baseline and counts of a study, as a JSON-able dict."""
    settings = stored_settings(study)
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    base = baseline_trial(study)
    out: dict[str, Any] = {"study": study.study_name, "objective": settings.objective, "trials": counts}
    try:
        best = best_trial(study)
    except ValueError:
        out["best"] = None
        return out
    out["best"] = {
        "trial": best.number,
        "value": best.value,
        "engine_kwargs": best.user_attrs.get("engine_kwargs"),
    }
    out["baseline_value"] = base.value if base is not None else None
    out["speedup_over_baseline"] = ratio(best.value, out["baseline_value"])
    return out
