"""Create, resume or open a study: its sampler, its stored settings and its baseline trial."""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import optuna

from autotune._logging import get_logger
from autotune.errors import StudyError
from autotune.study.pruning import BoundPruner
from autotune.study.settings import SETTINGS_ATTR, StudySettings, stored_settings
from autotune.study.storage import check_study_name, default_url, open_storage, redact
from autotune.trial.record import Role, TrialRecord

_logger = get_logger(__name__)


def make_sampler(
    seed: int, n_existing: int, n_startup_trials: int = 8, *, worker: int = 0
) -> optuna.samplers.BaseSampler:
    """Multivariate TPE, seeded. The seed moves on with the study's length, so a resumed study
    does not replay the random start-up configs it already tried, and with ``worker``, so two
    workers joining a shared study at the same length don't propose the same configs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=(seed + n_existing + 1_000_003 * worker) % 2**32,
            multivariate=True,
            # a queued trial lacks the params vLLM resolved outside the space (and all of them
            # while it runs); grouping keeps such a trial from emptying the joint space
            group=True,
            n_startup_trials=n_startup_trials,
            constant_liar=True,
        )


def make_pruner() -> optuna.pruners.BasePruner:
    """The study's pruner (see :mod:`autotune.study.pruning`); only sampled trials are ever
    stopped (the objective decides), queued ones (baseline, ``--enqueue``, informed, retries)
    always run whole."""
    return BoundPruner(n_startup_trials=5, quantile=0.5)


def load_existing(name: str, storage: optuna.storages.BaseStorage) -> optuna.Study | None:
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


def open_study(name: str, storage: str | None, studies_dir: Path) -> tuple[optuna.Study, str]:
    """Load an existing study to read it (``show``, ``export``, ``report``, ...).

    Returns:
        ``(study, redacted storage URL)``.

    Raises:
        StudyError: no such study (the message says where it looked and how to point elsewhere).
    """
    name = check_study_name(name)
    url = storage or default_url(name, studies_dir)
    if storage is None and not (studies_dir / f"{name}.db").is_file():
        raise StudyError(
            f"no study {name!r} in {studies_dir}/ (give --studies-dir, or --storage if it lives elsewhere; "
            f"`autotune ls --studies-dir DIR` lists what is there)"
        )
    study = load_existing(name, open_storage(url))
    if study is None:
        raise StudyError(f"no study named {name!r} in {redact(url)} (`autotune ls --storage URL` lists them)")
    return study, redact(url)


def create_or_resume(
    name: str,
    storage: optuna.storages.BaseStorage,
    settings: StudySettings | None,
    *,
    n_startup_trials: int = 8,
    worker: int = 0,
) -> tuple[optuna.Study, StudySettings, bool]:
    """Open study ``name``; create it with ``settings`` when it doesn't exist.

    ``worker`` tells the sampler seeds of parallel workers apart (0 for a study only one process
    runs, e.g. SQLite's).

    Returns:
        ``(study, settings, created)``; on resume the stored settings win, and ``settings`` (from
        the command line) must agree with them on model, workload and fixed engine args.

    Raises:
        StudyError: a new study without a model, or a resume whose command line conflicts.
    """
    existing = load_existing(name, storage)
    if existing is not None and not existing.user_attrs and not existing.get_trials(deepcopy=False):
        # created a moment ago by a worker started beside this one, whose settings are on their way
        _wait_for_settings(name, storage)
    if existing is not None:
        stored = stored_settings(existing)
        if settings is not None:
            _check_compatible(name, stored, settings)
        sampler = make_sampler(stored.seed, len(existing.trials), n_startup_trials, worker=worker)
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=make_pruner())
        return study, stored, False
    if settings is None:
        raise StudyError(f"study {name!r} does not exist yet; give --model to create it")
    try:
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            directions=settings.directions,
            sampler=make_sampler(settings.seed, 0, n_startup_trials, worker=worker),
            pruner=make_pruner(),
        )
    except optuna.exceptions.DuplicatedStudyError:
        # another worker created it a moment ago: join it once its settings are stored
        _wait_for_settings(name, storage)
        return create_or_resume(name, storage, settings, n_startup_trials=n_startup_trials, worker=worker)
    study.set_user_attr(SETTINGS_ATTR, settings.to_dict())
    # trial 0: vLLM's defaults under the fixed args, the reference every speedup is measured from
    study.enqueue_trial({}, user_attrs=TrialRecord(role=Role.BASELINE).attrs())
    return study, settings, True


#: how long a worker waits for the settings of a study another worker has just created
SETTINGS_WAIT_S = 30.0


def _wait_for_settings(name: str, storage: optuna.storages.BaseStorage) -> None:
    timeout_s = SETTINGS_WAIT_S
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        study = load_existing(name, storage)
        if study is not None and SETTINGS_ATTR in study.user_attrs:
            return
        time.sleep(0.5)
    raise StudyError(
        f"study {name!r} exists but holds no vllm-autotune settings (whoever created it stored none "
        f"within {timeout_s:g} s): give another --study name"
    )


def _check_compatible(name: str, stored: StudySettings, given: StudySettings) -> None:
    for label, a, b in (
        ("--model", stored.model, given.model),
        ("--workload", stored.workload, given.workload),
        ("fixed engine args", stored.fixed, given.fixed),
        ("--objective", stored.objective, given.objective),
        ("--objectives", stored.objectives, given.objectives),
    ):
        if a != b:
            raise StudyError(
                f"study {name!r} was created with {label} {a!r}, not {b!r}; resume it without "
                f"that option, or start a new --study"
            )


class _Param(Protocol):
    """A searched parameter (:class:`autotune.space.spec.ParamSpec`)."""

    @property
    def name(self) -> str: ...

    def records(self, value: Any) -> bool: ...


def enqueue_config(
    study: optuna.Study, config: dict[str, Any], parameters: Sequence[_Param], role: Role = Role.ENQUEUED
) -> list[str]:
    """Queue a config the user wants measured (e.g. a hand-tuned one) as the next trial.

    Keys that are searched go in as the trial's params; the rest, and a value outside a
    categorical's choices, apply to that trial only (measured as written, unseen by the sampler).

    Returns:
        The ``name=value`` pairs that are searched but outside the space.
    """
    by_name = {p.name: p for p in parameters}
    params = {k: v for k, v in config.items() if k in by_name and by_name[k].records(v)}
    outside = [f"{k}={v!r}" for k, v in config.items() if k in by_name and k not in params]
    attrs = TrialRecord(role=role, config=config).attrs()
    study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=False)
    return outside
