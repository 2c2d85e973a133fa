"""A run's inputs, every one checked before anything is written: a bad ``--set``, space,
workload or model leaves no study database, lock file or trial directory behind."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune._logging import get_logger
from autotune.errors import ServeError, StudyError
from autotune.space.constraints import bound_by_context, check_feasible, drop_requantization
from autotune.space.engine_args import EngineInfo, describe_engine
from autotune.space.load import load_space
from autotune.space.spec import SearchSpace
from autotune.study.storage import check_study_name, default_url, sqlite_path
from autotune.trial.model_ref import check_model, context_length, quantization_method
from autotune.trial.telemetry import visible_device_ids
from autotune.trial.workload import WorkloadSpec, load_requests, parse_workload
from autotune.tuning.placement import SlotPool, plan_slots
from autotune.tuning.request import RunRequest

_logger = get_logger(__name__)


@dataclass(frozen=True)
class RunInputs:
    """The checked inputs of a run.

    Attributes:
        name: The study's name.
        url: Its storage URL.
        engine: The installed vLLM's engine arguments.
        pool: The GPU slots trials run in.
        model: ``--model`` resolved, or None (a resume).
        workload: ``--workload`` parsed (a file's prompts read once), or None.
        space: ``--space`` loaded, or None; for a study known to be new (its SQLite file does not
            exist yet), the default space, so that ``--set`` is judged against it up front.
        new: The study certainly does not exist yet (its SQLite file is missing); False when
            only opening the storage can tell.
    """

    name: str
    url: str
    engine: EngineInfo
    pool: SlotPool
    model: str | None
    workload: WorkloadSpec | None
    space: SearchSpace | None
    new: bool

    @property
    def sqlite_file(self) -> Path | None:
        return sqlite_path(self.url)


def check_inputs(req: RunRequest) -> RunInputs:
    """Check every input of ``req``; nothing is written.

    Raises:
        AutotuneError: naming the option at fault and the fix.
    """
    name = check_study_name(req.study)
    url = req.storage or default_url(name, req.studies_dir)
    engine = describe_engine()
    pool = SlotPool(
        plan_slots(req.gpus, req.gpus_per_trial, visible=visible_device_ids(), platform=engine.platform)
    )
    model = check_model(req.model) if req.model is not None else None
    workload = parse_workload(req.workload) if req.workload is not None else None
    if workload is not None and workload.kind != "synthetic":
        load_requests(workload)  # an empty or malformed file fails here
    db = sqlite_path(url)
    new = db is not None and not db.is_file()
    check_serve(req, new=new)
    if new and model is None:
        raise StudyError(f"study {name!r} does not exist yet; give --model to create it")
    space = load_space_for(req.space, engine, pool, req.fixed, model) if req.space or new else None
    return RunInputs(name, url, engine, pool, model, workload, space, new)


def load_space_for(
    space: str | None, engine: EngineInfo, pool: SlotPool, fixed: dict[str, object], model: str | None
) -> SearchSpace:
    """``--space`` (or the platform's default) with ``--set`` on top, checked, without values that
    can only be invalid for the model, and feasible."""
    loaded = load_space(space, engine, gpus=pool.gpus_per_trial, extra_fixed=fixed)
    loaded, notes = bound_by_context(loaded, context_length(model) if model else None)
    loaded, more = drop_requantization(loaded, quantization_method(model) if model else None)
    for note in notes + more:
        _logger.info("space: %s", note)
    check_feasible(loaded, gpus=pool.gpus_per_trial)
    return loaded


def check_serve(req: RunRequest, *, new: bool = True) -> None:
    """Serve mode's options go together: a load with ``--mode serve``, and ``--mode serve`` with a
    load, one kind of it. ``new``: the study certainly does not exist yet (a resume may repeat
    its options or leave them out; the session compares them with the stored ones).

    Raises:
        ServeError: naming the option at fault and the fix.
    """
    if req.concurrency is not None and req.request_rate is not None:
        raise ServeError(
            "--concurrency and --request-rate together make requests wait in the client, which vLLM's "
            "latencies leave out (a slow config would look fast): give one of them"
        )
    if not new:
        return
    given = [
        opt
        for opt, value in (
            ("--concurrency", req.concurrency),
            ("--request-rate", req.request_rate),
            ("--slo", req.slos),
        )
        if value is not None
    ]
    if req.mode != "serve" and given:
        raise ServeError(f"{', '.join(given)} only apply to serve mode: add --mode serve (a new study)")
    if req.mode == "serve" and req.concurrency is None and req.request_rate is None:
        raise ServeError(
            "--mode serve needs the load to measure the server under: --concurrency N (clients at once) "
            "and/or --request-rate R (requests per second)"
        )
