"""Open a study for a run: the storage with the study's heartbeat, the study created or resumed
(its stored settings reconciled with the command line), cut-off trials recovered, a failed
baseline dealt with, and the budget set."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import optuna

from autotune._logging import get_logger
from autotune.atomic import write_text_atomic
from autotune.errors import StudyError
from autotune.space.constraints import bound_by_context
from autotune.space.load import build_space
from autotune.space.lossy import lossy_parameters
from autotune.space.spec import SearchSpace
from autotune.study.budget import counted_trials
from autotune.study.lifecycle import create_or_resume, enqueue_config, load_existing
from autotune.study.recovery import (
    fail_interrupted,
    fail_stale,
    queue_retry,
    requeue_interrupted,
    retry_stale,
)
from autotune.study.settings import (
    BUDGET_ATTR,
    DEFAULT_QUALITY_BUDGET,
    DEFAULT_TRIALS,
    DEFAULT_WORKLOAD,
    HEARTBEAT_ATTR,
    SETTINGS_ATTR,
    StudySettings,
    budget,
    stored_heartbeat,
    stored_settings,
)
from autotune.study.storage import DEFAULT_HEARTBEAT_S, open_storage
from autotune.study.trials import baseline_failure_message, failed_baseline
from autotune.trial.model_ref import context_length
from autotune.trial.record import CANNOT_RUN, TrialRecord
from autotune.trial.telemetry import gpu_names
from autotune.trial.workload import WorkloadSpec, load_requests, parse_workload
from autotune.tuning.inputs import RunInputs, check_serve, load_space_for
from autotune.tuning.request import RunRequest

_logger = get_logger(__name__)


@dataclass(frozen=True)
class Session:
    """An open study, ready to run: what :func:`optimize` needs."""

    study: optuna.Study
    settings: StudySettings
    space: SearchSpace
    created: bool
    total: int
    heartbeat_s: int
    sole_worker: bool
    study_dir: Path
    requests_file: str | None


def _storage(
    req: RunRequest, inputs: RunInputs
) -> tuple[optuna.storages.BaseStorage, int, optuna.Study | None]:
    """The storage, opened with the heartbeat interval the study was created with, and the
    study as it stands (None: it does not exist yet)."""
    heartbeat_s = req.heartbeat_s or DEFAULT_HEARTBEAT_S
    storage = open_storage(inputs.url, heartbeat_s=heartbeat_s, on_stale=retry_stale)
    existing = load_existing(inputs.name, storage)
    stored = stored_heartbeat(existing) if existing is not None else None
    if stored is None or stored == heartbeat_s:
        return storage, heartbeat_s, existing
    # every worker must judge staleness alike, or one fails another's live trials
    if req.heartbeat_s is not None:
        _logger.warning(
            "study %r runs with --heartbeat %d (stored when it was created); ignoring %d",
            inputs.name,
            stored,
            req.heartbeat_s,
        )
    storage = open_storage(inputs.url, heartbeat_s=stored, on_stale=retry_stale)
    return storage, stored, load_existing(inputs.name, storage)


def _new_settings(req: RunRequest, inputs: RunInputs, space: SearchSpace) -> StudySettings:
    if inputs.model is None:
        raise StudyError(f"study {inputs.name!r} does not exist yet; give --model to create it")
    engine = inputs.engine
    device_ids = sorted({i for s in inputs.pool.slots for i in s.device_ids})
    serve = req.mode == "serve"
    check_serve(req, new=True)  # a server storage's new study: the checks a SQLite one had up front
    return StudySettings(
        model=inputs.model,
        workload=(inputs.workload or parse_workload(DEFAULT_WORKLOAD)).to_dict(),
        space=space.to_dict(),
        objective=(req.objectives or [req.objective or "output_tokens_per_s"])[0],
        objectives=list(req.objectives or []),
        seed=req.seed,
        vllm_version=engine.vllm_version,
        distribution=engine.distribution,
        platform=engine.platform,
        gpus=gpu_names(device_ids) if engine.platform != "cpu" else [],
        quality_budget=_quality_budget(req, space),
        mode=req.mode or "offline",
        load={"concurrency": req.concurrency, "request_rate": req.request_rate} if serve else {},
        slos=dict(req.slos or {}) if serve else {},
    )


def _quality_budget(req: RunRequest, space: SearchSpace) -> float | None:
    """A new study's quality budget: None (the guard off) for --no-quality-check or dummy weights,
    said once either way when the space searches arguments that change outputs."""
    lossy = lossy_parameters([p.name for p in space.parameters])
    dummy = space.fixed.get("load_format") == "dummy"
    if req.quality_check and not dummy:
        budget = req.quality_budget if req.quality_budget is not None else DEFAULT_QUALITY_BUDGET
        _logger.info(
            "quality guard: a config whose outputs drift from the baseline's by more than %g nats of "
            "mean KL per token is pruned%s",
            budget,
            f" (searched lossy args: {', '.join(lossy)})" if lossy else "",
        )
        return budget
    why = (
        "dummy weights (load_format=dummy) make any quality measure meaningless"
        if dummy
        else ("--no-quality-check")
    )
    _logger.warning(
        "quality check OFF (%s): configs are ranked by speed alone%s",
        why,
        f"; {', '.join(lossy)} change the model's outputs and may win unmeasured" if lossy else "",
    )
    return None


def _resumed_space(req: RunRequest, inputs: RunInputs, stored: StudySettings) -> SearchSpace:
    _check_resume(inputs.name, stored, req, inputs)
    if inputs.space is not None and req.space:
        if inputs.space.fixed != stored.fixed:
            raise StudyError(
                f"study {inputs.name!r} fixes {stored.fixed}, --space {req.space} fixes "
                f"{inputs.space.fixed}: "
                "that changes the benchmark under the baseline; start a new --study"
            )
        # bounded by the study's model (a resume names no --model)
        bounded, notes = bound_by_context(inputs.space, context_length(stored.model))
        for note in notes:
            _logger.info("space: %s", note)
        return bounded
    return build_space(
        stored.space,
        inputs.engine,
        source=f"study {inputs.name}",
        gpus=inputs.pool.gpus_per_trial,
        name=stored.space.get("name", "stored"),
    )


def open_session(req: RunRequest, inputs: RunInputs) -> Session:
    """Create or resume the study, recover what an earlier run left cut off, set the budget."""
    storage, heartbeat_s, existing = _storage(req, inputs)
    settings: StudySettings | None = None
    if existing is None:
        space = inputs.space or load_space_for(req.space, inputs.engine, inputs.pool, req.fixed, inputs.model)
        settings = _new_settings(req, inputs, space)
    else:
        space = _resumed_space(req, inputs, stored_settings(existing))
    # parallel workers of a shared study (never SQLite's: one run at a time) seed apart
    sole_worker = inputs.sqlite_file is not None  # the SQLite lock is held: no other process runs it
    study, settings, created = create_or_resume(
        inputs.name, storage, settings, worker=0 if sole_worker else os.getpid()
    )
    _recover(study, storage, sole_worker)
    _check_baseline(study)  # before anything of this command is written
    total = _set_budget(study, req, created, heartbeat_s)
    if not created and req.space:
        study.set_user_attr(SETTINGS_ATTR, {**settings.to_dict(), "space": space.to_dict()})
    study_dir = req.studies_dir / inputs.name
    wl = WorkloadSpec(**settings.workload)
    requests_file = _requests_file(study_dir, wl, fresh=created)
    for config in req.enqueue:
        outside = enqueue_config(study, config, space.parameters)
        if outside:
            _logger.warning(
                "--enqueue %s: %s outside the space: measured as written, but not a searched value "
                "the sampler learns from (widen the space to search it)",
                json.dumps(config),
                ", ".join(outside),
            )
    for dropped in space.dropped:
        _logger.info("space: %s is not in this vLLM; dropped (optional)", dropped)
    return Session(study, settings, space, created, total, heartbeat_s, sole_worker, study_dir, requests_file)


def _check_baseline(study: optuna.Study) -> None:
    """A study whose baseline failed compares nothing: refuse it when the failure is the config's
    (out of memory, invalid), else run the baseline again (a timeout or crash may not recur, e.g.
    with a larger --trial-timeout)."""
    failed = failed_baseline(study)
    if failed is None:
        return
    if TrialRecord.of(failed).outcome in CANNOT_RUN:
        raise StudyError(baseline_failure_message(study, failed))
    _logger.info("the baseline (trial #%d) failed in an earlier run; it runs again first", failed.number)
    queue_retry(study, failed, "the baseline failed in an earlier run")


def _recover(study: optuna.Study, storage: optuna.storages.BaseStorage, sole_worker: bool) -> None:
    if sole_worker:
        # whatever is RUNNING was cut off; requeueing is safe with no other process to double it
        # (elsewhere a trial cut off by Ctrl-C is queued again by its own worker, see Objective)
        for n in fail_interrupted(study, storage):
            _logger.warning("trial #%d was cut off by an earlier run that died; marked failed", n)
        for n in requeue_interrupted(study):
            _logger.info("trial #%d was interrupted: its config runs again", n)
    else:  # other workers may be running: only trials whose worker stopped beating are dead
        fail_stale(study)


def _set_budget(study: optuna.Study, req: RunRequest, created: bool, heartbeat_s: int) -> int:
    """The budget lives in the study, shared by every worker: ``--trials N`` sets it to N (the
    same command on each machine, or again after a crash, keeps it); a plain resume runs up to it.
    A stored budget is never lowered without a word, and never below the trials already used."""
    if created:
        study.set_user_attr(HEARTBEAT_ATTR, heartbeat_s)
        study.set_user_attr(BUDGET_ATTR, req.trials or DEFAULT_TRIALS)
        return req.trials or DEFAULT_TRIALS
    stored = budget(study)
    if req.trials is None or req.trials == stored:
        return stored
    used = counted_trials(study)
    if req.trials < used:
        _logger.warning(
            "--trials %d is the study's total budget, and it has used %d already: nothing more runs, "
            "and its budget stays at %d (a plain resume runs up to it); pass --trials M > %d to extend it",
            req.trials,
            used,
            stored,
            used,
        )
        return req.trials
    if req.trials < stored:
        _logger.warning(
            "lowering the budget of study %r from %d to %d trials (--trials is the total, not the "
            "number to add)",
            study.study_name,
            stored,
            req.trials,
        )
    study.set_user_attr(BUDGET_ATTR, req.trials)
    return req.trials


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


def _check_resume(name: str, stored: StudySettings, req: RunRequest, inputs: RunInputs) -> None:
    if inputs.model is not None and inputs.model != stored.model:
        raise StudyError(
            f"study {name!r} tunes model {stored.model!r}, not {req.model!r}; drop --model to "
            "resume it, or start a new --study"
        )
    if inputs.workload is not None and inputs.workload.to_dict() != stored.workload:
        raise StudyError(
            f"study {name!r} was created with another --workload ({stored.workload}); drop "
            "--workload to resume it, or start a new --study"
        )
    if req.objectives is not None and req.objectives != stored.objectives:
        raise StudyError(
            f"study {name!r} optimises {', '.join(stored.values)}; drop --objectives or start a new --study"
        )
    if req.objective is not None and req.objective != stored.objective:
        raise StudyError(
            f"study {name!r} maximises {stored.objective}; drop --objective or start a new --study"
        )
    serve = {
        "--mode": (req.mode, stored.mode),
        "--concurrency": (req.concurrency, stored.load.get("concurrency")),
        "--request-rate": (req.request_rate, stored.load.get("request_rate")),
        "--slo": (req.slos, stored.slos),
    }
    for opt, (given, kept) in serve.items():
        if given is not None and given != kept:
            raise StudyError(
                f"study {name!r} was created with {opt} {kept if kept not in (None, {}) else 'unset'}, "
                f"not {given}: that changes what every trial was measured by; drop {opt} to resume "
                "it, or start a new --study"
            )
    if (req.quality_budget is not None and req.quality_budget != stored.quality_budget) or (
        not req.quality_check and stored.quality_budget is not None
    ):
        _logger.warning(
            "study %r keeps the quality budget it was created with (%s): trials judged already "
            "would not compare with new ones; start a new --study to change it",
            name,
            "off" if stored.quality_budget is None else f"{stored.quality_budget:g} nats",
        )
    changed = {k: v for k, v in req.fixed.items() if stored.fixed.get(k) != v}
    if changed:
        raise StudyError(
            f"study {name!r} fixes {stored.fixed}; --set {changed} would change the benchmark "
            "under the baseline: start a new --study"
        )
