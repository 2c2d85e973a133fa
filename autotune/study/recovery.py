"""Trials cut off before they could finish: a tuner killed mid-trial, a worker that stopped
sending heartbeats, Ctrl-C. Each is failed for the record and its config queued to run again."""

from __future__ import annotations

import time
import warnings

import optuna

from autotune._logging import get_logger
from autotune.study.budget import counted_trials
from autotune.trial.record import Outcome, TrialRecord, mark

_logger = get_logger(__name__)
STALE_REASON = "its worker stopped sending heartbeats (killed, or its machine was lost)"


def queue_retry(study: optuna.Study, trial: optuna.trial.BaseTrial, reason: str) -> None:
    """Queue ``trial``'s config to run again (its own trial was cut off, and doesn't count)."""
    again = TrialRecord.of(trial).slot(retry_of=trial.number, retry_reason=reason)
    study.enqueue_trial(dict(trial.params), user_attrs=again.attrs())


def queue_back(study: optuna.Study, trial: optuna.trial.BaseTrial) -> None:
    """Put the config ``trial`` took from the queue back there, as it was queued (it never ran)."""
    again = TrialRecord.of(trial).slot()
    study.enqueue_trial(dict(trial.params), user_attrs=again.attrs(), skip_if_exists=False)


def retry_stale(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Heartbeat callback: ``trial``'s worker stopped beating (killed, or its machine lost) and
    Optuna failed the trial; queue its config again, so the study still measures it."""
    _logger.warning("trial #%d: %s; marked failed, its config runs again", trial.number, STALE_REASON)
    queue_retry(study, trial, STALE_REASON)


def fail_interrupted(study: optuna.Study, storage: optuna.storages.BaseStorage) -> list[int]:
    """Mark RUNNING trials FAIL (``error_type=interrupted``); only safe while no other worker can
    be running this study (the SQLite lock is held). Returns their numbers."""

    class _OnStorage:
        def __init__(self, trial_id: int) -> None:
            self.trial_id = trial_id

        def set_user_attr(self, key: str, value: object) -> None:
            storage.set_trial_user_attr(self.trial_id, key, value)

    numbers = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        mark(_OnStorage(t._trial_id), Outcome.INTERRUPTED, "the tuner was killed during this trial")
        storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        numbers.append(t.number)
    return numbers


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Queue again every config whose trial was interrupted and not yet retried."""
    trials = study.get_trials(deepcopy=False)
    retried = {TrialRecord.of(t).retry_of for t in trials}
    done = []
    for t in trials:
        if TrialRecord.of(t).error_type != Outcome.INTERRUPTED.value or t.number in retried:
            continue
        queue_retry(study, t, Outcome.INTERRUPTED.value)
        done.append(t.number)
    return done


def fail_stale(study: optuna.Study) -> None:
    """Fail the trials whose workers stopped sending heartbeats (``retry_stale`` requeues them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def finished_elsewhere(error: BaseException) -> bool:
    """Optuna refusing to record a trial because it is finished already (failed as stale)."""
    return isinstance(error, optuna.exceptions.UpdateFinishedTrialError) or "Cannot tell a" in str(error)


def wait_for_other_workers(
    study: optuna.Study, total: int, heartbeat_s: float, grace_s: float, *, max_wait_s: float
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
        fail_stale(study)
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
                grace_s,
            )
            said = True
        time.sleep(max(1.0, heartbeat_s / 2))
