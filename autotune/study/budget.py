"""The study's trial budget, shared by every worker and counted in the storage."""

from __future__ import annotations

import optuna

from autotune.trial.record import TrialRecord


def _counted(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    retried = {TrialRecord.of(t).retry_of for t in trials}
    return [
        t
        for t in trials
        if t.state != optuna.trial.TrialState.WAITING
        and TrialRecord.of(t).counted
        and t.number not in retried  # cut off (its worker died) and run again: the retry counts
    ]


def counted_trials(study: optuna.Study) -> int:
    """Trials that used up the study's budget: launched, finished or still running anywhere."""
    return len(_counted(study.get_trials(deepcopy=False)))


def _started(t: optuna.trial.FrozenTrial) -> tuple[float, int]:
    """A trial's place in the budget: when it started (not yet: last), ties by number."""
    return (t.datetime_start.timestamp() if t.datetime_start else float("inf"), t.number)


def budget_order(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials that used up the study's budget, in the order they started (ties by number)."""
    return sorted(_counted(study.get_trials(deepcopy=False)), key=_started)


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
    return sum(1 for t in counted if _started(t) < _started(mine)) >= total
