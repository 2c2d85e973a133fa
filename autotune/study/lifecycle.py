"""Create or resume the Optuna study: sampler, storage, stored settings, the baseline trial."""

from __future__ import annotations

import time
import warnings
from typing import Any

import optuna

from autotune._logging import get_logger
from autotune.errors import StudyError
from autotune.study.settings import StudySettings

_logger = get_logger(__name__)
SETTINGS_ATTR = "autotune"
ROLE_ATTR = "autotune_role"
BUDGET_ATTR = "autotune_budget"
#: the study's heartbeat interval: every worker must judge staleness alike
HEARTBEAT_ATTR = "autotune_heartbeat_s"
RETRY_ATTR = "autotune_retry_of"
RETRY_REASON_ATTR = "autotune_retry_reason"
#: on a sampled trial whose config an earlier trial measured already: that trial's number
DUPLICATE_ATTR = "autotune_duplicate_of"
#: error types of trials that did not use up the budget: never launched (a constraint, or started
#: by a worker after the budget was used up elsewhere), or cut off by the user
UNCOUNTED = ("constraint", "interrupted", "over_budget")
CONFIG_ATTR = "autotune_config"


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
            # the baseline trial has no params; grouping keeps it from emptying the joint space
            group=True,
            n_startup_trials=n_startup_trials,
            constant_liar=True,
        )


def load_existing(name: str, storage: optuna.storages.BaseStorage) -> optuna.Study | None:
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


def stored_settings(study: optuna.Study) -> StudySettings:
    raw = study.user_attrs.get(SETTINGS_ATTR)
    if not isinstance(raw, dict):
        raise StudyError(
            f"study {study.study_name!r} exists but was not made by vllm-autotune (no settings stored)"
        )
    return StudySettings.from_dict(raw)


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
    if existing is not None:
        stored = stored_settings(existing)
        if settings is not None:
            _check_compatible(name, stored, settings)
        sampler = make_sampler(stored.seed, len(existing.trials), n_startup_trials, worker=worker)
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
        return study, stored, False
    if settings is None:
        raise StudyError(f"study {name!r} does not exist yet; give --model to create it")
    try:
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            direction="maximize",
            sampler=make_sampler(settings.seed, 0, n_startup_trials, worker=worker),
        )
    except optuna.exceptions.DuplicatedStudyError:
        # another worker created it a moment ago: join it once its settings are stored
        _wait_for_settings(name, storage)
        return create_or_resume(name, storage, settings, n_startup_trials=n_startup_trials, worker=worker)
    study.set_user_attr(SETTINGS_ATTR, settings.to_dict())
    # trial 0: vLLM's defaults under the fixed args, the reference every speedup is measured from
    study.enqueue_trial({}, user_attrs={ROLE_ATTR: "baseline"})
    return study, settings, True


def _wait_for_settings(name: str, storage: optuna.storages.BaseStorage, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        study = load_existing(name, storage)
        if study is not None and SETTINGS_ATTR in study.user_attrs:
            return
        time.sleep(0.5)
    raise StudyError(f"study {name!r} was created by another process that stored no settings")


def _check_compatible(name: str, stored: StudySettings, given: StudySettings) -> None:
    for label, a, b in (
        ("--model", stored.model, given.model),
        ("--workload", stored.workload, given.workload),
        ("fixed engine args", stored.fixed, given.fixed),
        ("--objective", stored.objective, given.objective),
    ):
        if a != b:
            raise StudyError(
                f"study {name!r} was created with {label} {a!r}, not {b!r}; resume it without "
                f"that option, or start a new --study"
            )


def enqueue_config(study: optuna.Study, config: dict[str, Any], space_names: set[str]) -> None:
    """Queue a config the user wants measured (e.g. a hand-tuned one) as the next trial.

    Keys that are searched go in as the trial's params; the rest apply to that trial only.
    """
    params = {k: v for k, v in config.items() if k in space_names}
    study.enqueue_trial(params, user_attrs={ROLE_ATTR: "enqueued", CONFIG_ATTR: config}, skip_if_exists=False)


def baseline_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The completed baseline trial, if any."""
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if t.user_attrs.get(ROLE_ATTR) == "baseline":
            return t
    return None


def _counted(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    retried = {t.user_attrs.get(RETRY_ATTR) for t in trials}
    return [
        t
        for t in trials
        if t.state != optuna.trial.TrialState.WAITING
        and t.user_attrs.get("error_type") not in UNCOUNTED
        and t.number not in retried  # cut off (its worker died) and run again: the retry counts
        and DUPLICATE_ATTR not in t.user_attrs  # answered from an earlier trial, nothing ran
    ]


def counted_trials(study: optuna.Study) -> int:
    """Trials that used up the study's budget: launched, finished or still running anywhere."""
    return len(_counted(study.get_trials(deepcopy=False)))


def find_duplicate(study: optuna.Study, engine_kwargs: dict[str, Any]) -> optuna.trial.FrozenTrial | None:
    """A completed trial that ran exactly ``engine_kwargs`` already (the first one), if any.

    Engine args, not params: an enqueued config may set args the space does not search.
    """
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if (
            DUPLICATE_ATTR not in t.user_attrs
            and t.value is not None
            and t.user_attrs.get("engine_kwargs") == engine_kwargs
        ):
            return t
    return None


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial:
    """The best completed trial; a repeat that ties with it stands for the trial it repeats.

    Raises:
        ValueError: no trial completed.
    """
    best = study.best_trial
    if DUPLICATE_ATTR in best.user_attrs:
        return study.trials[int(best.user_attrs[DUPLICATE_ATTR])]
    return best


def over_budget(study: optuna.Study, trial: optuna.trial.BaseTrial, total: int) -> bool:
    """Whether ``trial`` (just started) is beyond the study's budget of ``total``.

    Parallel workers check the budget after each trial, so two of them may start a trial at the
    same moment when one slot is left. Trials are ranked by when they started (ties by number),
    and only the first ``total`` of them run: the count holds however many workers join.
    """
    counted = _counted(study.get_trials(deepcopy=False))
    mine = next((t for t in counted if t.number == trial.number), None)
    if mine is None or mine.datetime_start is None:
        return False

    def key(t: optuna.trial.FrozenTrial) -> tuple[float, int]:
        return (t.datetime_start.timestamp() if t.datetime_start else float("inf"), t.number)

    return sum(1 for t in counted if key(t) < key(mine)) >= total


DEFAULT_TRIALS = 30


def budget(study: optuna.Study) -> int:
    """The study's trial budget; a study written before budgets were stored gets the default."""
    return int(study.user_attrs.get(BUDGET_ATTR, DEFAULT_TRIALS))


def fail_interrupted(study: optuna.Study, storage: optuna.storages.BaseStorage) -> list[int]:
    """Mark RUNNING trials FAIL (``error_type=interrupted``); only safe while no other worker can
    be running this study (the SQLite lock is held). Returns their numbers."""
    numbers = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        storage.set_trial_user_attr(t._trial_id, "outcome", "interrupted")
        storage.set_trial_user_attr(t._trial_id, "error_type", "interrupted")
        storage.set_trial_user_attr(t._trial_id, "error", "the tuner was killed during this trial")
        storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        numbers.append(t.number)
    return numbers


def _retry_attrs(t: optuna.trial.BaseTrial, reason: str) -> dict[str, Any]:
    attrs = {
        RETRY_ATTR: t.number,
        ROLE_ATTR: t.user_attrs.get(ROLE_ATTR, "sampled"),
        RETRY_REASON_ATTR: reason,
    }
    if CONFIG_ATTR in t.user_attrs:
        attrs[CONFIG_ATTR] = t.user_attrs[CONFIG_ATTR]
    return attrs


def queue_retry(study: optuna.Study, trial: optuna.trial.BaseTrial, reason: str) -> None:
    """Queue ``trial``'s config to run again (its own trial was cut off, and doesn't count)."""
    study.enqueue_trial(dict(trial.params), user_attrs=_retry_attrs(trial, reason))


def retry_stale(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Heartbeat callback: ``trial``'s worker stopped beating (killed, or its machine lost) and
    Optuna failed the trial; queue its config again, so the study still measures it."""
    reason = "its worker stopped sending heartbeats (killed, or its machine was lost)"
    _logger.warning("trial #%d: %s; marked failed, its config runs again", trial.number, reason)
    queue_retry(study, trial, reason)


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Queue again every config whose trial was interrupted and not yet retried."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(RETRY_ATTR) for t in trials}
    done = []
    for t in trials:
        if t.user_attrs.get("error_type") != "interrupted" or t.number in retried:
            continue
        queue_retry(study, t, "interrupted")
        done.append(t.number)
    return done
