"""Validation rounds: the top configs of the search and the baseline, measured again.

Each round measures the baseline and the configs in it once (a config that joined the top
later gets rounds of its own), in a seeded shuffled order, each a fresh isolated
trial (the same worker, timeout and outcome rules as the search), so drift hits all alike. The
rounds live in the study's validation study (:mod:`autotune.study.validation`): a killed
validation continues with the rounds it lacks, and PostgreSQL workers share them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import optuna

from autotune._logging import get_logger
from autotune.analysis.verdict import Verdict, study_verdict
from autotune.errors import StudyError
from autotune.study.recovery import fail_interrupted, fail_stale, requeue_interrupted
from autotune.study.trials import baseline_trial
from autotune.study.validation import measurements, open_validation, plan_rounds, queue_rounds, top_configs
from autotune.trial.record import Outcome, Role, TrialRecord, mark
from autotune.tuning.measure import Measuring, TrialFailed, record_slot, start, value_of

_logger = get_logger(__name__)
DEFAULT_TOP = 3
DEFAULT_ROUNDS = 3


class NothingQueued(TrialFailed):
    """Every validation slot is measured or taken by another worker; this trial runs nothing."""


@dataclass(kw_only=True)
class ValidationObjective(Measuring):
    """Callable for the validation study's ``optimize``: one call measures one queued slot."""

    search: optuna.Study

    def __call__(self, trial: optuna.Trial) -> float:
        record = TrialRecord.of(trial)
        if record.validates is None:  # not from the queue: nothing is left to measure
            mark(trial, Outcome.OVER_BUDGET, "every validation slot was measured or taken by another worker")
            trial.study.stop()
            raise NothingQueued(f"validation trial #{trial.number}: nothing queued")
        engine_kwargs = dict(TrialRecord.of(self.search.trials[record.validates]).engine_kwargs or {})
        trial_dir = self.study_dir / "validation" / str(trial.number)
        start(trial, trial_dir, engine_kwargs)
        with self.pool.take() as slot:
            record_slot(trial, slot)
            return value_of(self.measure(trial, engine_kwargs, trial_dir, slot), self.settings.objective)


def _log_round(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    record = TrialRecord.of(trial)
    if record.validates is None:
        return
    what = "vLLM's defaults" if record.role is Role.BASELINE else f"the config of trial #{record.validates}"
    value = f"{trial.value:,.1f}" if trial.value is not None else f"{trial.state.name} [{record.error_type}]"
    _logger.info("validation round %d: %s -> %s", (record.validation_round or 0) + 1, what, value)


def validate(
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    objective: ValidationObjective,
    *,
    top: int = DEFAULT_TOP,
    rounds: int = DEFAULT_ROUNDS,
    seed: int = 0,
    sole_worker: bool = True,
    callbacks: Sequence[Callable[[optuna.Study, optuna.trial.FrozenTrial], None]] = (),
) -> Verdict | None:
    """Measure the ``top`` search configs and the baseline in ``rounds`` rounds; the verdict.

    Raises:
        StudyError: no baseline completed (there is nothing to compare with).
    """
    base = baseline_trial(study)
    if base is None:
        raise StudyError(
            f"study {study.study_name!r} has no completed baseline: validation compares every config "
            "with vLLM's defaults measured in the same round; run the search first"
        )
    val = open_validation(study, storage)
    if sole_worker:
        for n in fail_interrupted(val, storage):
            _logger.warning("validation trial #%d was cut off by an earlier run that died; it runs again", n)
        requeue_interrupted(val)
    else:
        fail_stale(val)
    candidates = top_configs(study, top)
    if not candidates:
        _logger.info("nothing to validate: no config of the search but the baseline completed")
        return study_verdict(study, seed=seed)
    members = [base.number] + [t.number for t in candidates]
    slots = plan_rounds(measurements(val), members, rounds, seed)
    queue_rounds(val, slots, {base.number: Role.BASELINE})
    queued = val.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    waiting = len(queued)
    if waiting:
        _logger.info(
            "validating the %d best config(s) of the search (trials %s) against vLLM's defaults, "
            "each in %d round(s): %d measurement(s) to run in %d round(s)",
            len(candidates),
            ", ".join(f"#{t.number}" for t in candidates) or "none",
            rounds,
            waiting,
            len({TrialRecord.of(t).validation_round for t in queued}),
        )
        val.optimize(
            objective,
            n_trials=waiting,
            n_jobs=len(objective.pool.slots),
            callbacks=[_log_round, *callbacks],
            catch=(TrialFailed,),
        )
    verdict = study_verdict(study, seed=seed)
    if verdict is not None:
        _logger.info("verdict: %s", verdict.verdict)
    return verdict
