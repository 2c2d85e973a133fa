"""Create or resume the Optuna study: sampler, storage, stored settings, the baseline trial."""

from __future__ import annotations

import warnings
from typing import Any

import optuna

from autotune._logging import get_logger
from autotune.config import StudySettings
from autotune.errors import StudyError

_logger = get_logger(__name__)
SETTINGS_ATTR = "autotune"
ROLE_ATTR = "autotune_role"
BUDGET_ATTR = "autotune_budget"
RETRY_ATTR = "autotune_retry_of"
#: error types of trials that did not use up the budget (never launched, or cut off by the user)
UNCOUNTED = ("constraint", "interrupted")
CONFIG_ATTR = "autotune_config"


def make_sampler(seed: int, n_existing: int, n_startup_trials: int = 8) -> optuna.samplers.BaseSampler:
    """Multivariate TPE, seeded. The seed moves on with the study's length, so a resumed study
    does not replay the random start-up configs it already tried."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed + n_existing,
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
) -> tuple[optuna.Study, StudySettings, bool]:
    """Open study ``name``; create it with ``settings`` when it doesn't exist.

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
        sampler = make_sampler(stored.seed, len(existing.trials), n_startup_trials)
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
        return study, stored, False
    if settings is None:
        raise StudyError(f"study {name!r} does not exist yet; give --model to create it")
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        direction="maximize",
        sampler=make_sampler(settings.seed, 0, n_startup_trials),
    )
    study.set_user_attr(SETTINGS_ATTR, settings.to_dict())
    # trial 0: vLLM's defaults under the fixed args, the reference every speedup is measured from
    study.enqueue_trial({}, user_attrs={ROLE_ATTR: "baseline"})
    return study, settings, True


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


def counted_trials(study: optuna.Study) -> int:
    """Trials that used up the study's budget: launched, finished or still running anywhere."""
    return sum(
        1
        for t in study.get_trials(deepcopy=False)
        if t.state != optuna.trial.TrialState.WAITING and t.user_attrs.get("error_type") not in UNCOUNTED
    )


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


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Queue again every config whose trial was interrupted and not yet retried."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(RETRY_ATTR) for t in trials}
    done = []
    for t in trials:
        if t.user_attrs.get("error_type") != "interrupted" or t.number in retried:
            continue
        attrs = {RETRY_ATTR: t.number, ROLE_ATTR: t.user_attrs.get(ROLE_ATTR, "sampled")}
        if CONFIG_ATTR in t.user_attrs:
            attrs[CONFIG_ATTR] = t.user_attrs[CONFIG_ATTR]
        study.enqueue_trial(dict(t.params), user_attrs=attrs)
        done.append(t.number)
    return done
