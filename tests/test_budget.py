"""The study's budget is global: counted in storage, exact when workers race, whole after a worker dies."""

from __future__ import annotations

import time
from pathlib import Path

import optuna
import pytest

from autotune.space.load import build_space
from autotune.study.budget import counted_trials, over_budget
from autotune.study.recovery import retry_stale
from autotune.study.storage import open_storage
from autotune.trial.record import RETRY_ATTR, ROLE_ATTR
from autotune.tuning.objective import OverBudget
from tests.helpers import fake_trials, objective_for

pytestmark = [
    pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used"),
    pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
]


def _study(tmp_path: Path, **kw) -> optuna.Study:
    storage = open_storage(f"sqlite:///{tmp_path / 's.db'}", **kw)
    return optuna.create_study(study_name="s", storage=storage, direction="maximize")


def _space(engine):
    return build_space(
        {"name": "t", "parameters": {"max_num_seqs": {"type": "int", "low": 1, "high": 256}}},
        engine,
        source="test",
    )


def test_only_the_first_trials_to_start_are_within_the_budget(tmp_path: Path):
    study = _study(tmp_path)
    first, second, third = study.ask(), study.ask(), study.ask()  # three workers at once
    assert not over_budget(study, first, 2) and not over_budget(study, second, 2)
    assert over_budget(study, third, 2)
    # a trial cut off (and so uncounted) gives its place back
    first.set_user_attr("error_type", "interrupted")
    study.tell(first, state=optuna.trial.TrialState.FAIL)
    assert counted_trials(study) == 2 and not over_budget(study, third, 2)


def test_a_queued_trial_is_ranked_by_when_it_started_not_by_its_number(tmp_path: Path):
    study = _study(tmp_path)
    study.enqueue_trial({}, user_attrs={ROLE_ATTR: "baseline"})  # number 0, waits
    # two other workers' trials start first (numbers 1, 2: created running, not from the queue)
    for _ in range(2):
        study._storage.create_new_trial(study._study_id)
        time.sleep(0.01)
    queued = study.ask()  # pops #0: the lowest number, but the last to start
    assert queued.number == 0 and queued.user_attrs[ROLE_ATTR] == "baseline"
    assert over_budget(study, queued, 2)  # ranked by number it would be first in line
    assert not over_budget(study, study.trials[1], 2) and not over_budget(study, study.trials[2], 2)


def test_a_stale_trial_is_failed_and_its_config_queued_once(tmp_path: Path):
    study = _study(tmp_path, heartbeat_s=1, on_stale=retry_stale)
    dead = study.ask({"max_num_seqs": optuna.distributions.IntDistribution(1, 256)})
    dead.set_user_attr(ROLE_ATTR, "sampled")
    study._storage.record_heartbeat(dead._trial_id)  # its worker beat once, then died
    time.sleep(5.5)  # grace 4 s; SQLite clocks count whole seconds
    optuna.storages.fail_stale_trials(study)
    optuna.storages.fail_stale_trials(study)  # a second worker checking too: no second retry
    trials = study.get_trials()
    assert trials[0].state == optuna.trial.TrialState.FAIL
    (retry,) = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
    assert retry.user_attrs[RETRY_ATTR] == dead.number and retry.user_attrs[ROLE_ATTR] == "sampled"
    assert counted_trials(study) == 0  # the dead trial doesn't use the budget; its retry will
    popped = study.ask()
    assert popped.number == retry.number
    assert popped.suggest_int("max_num_seqs", 1, 256) == dead.params["max_num_seqs"]
    assert counted_trials(study) == 1


def test_a_worker_that_starts_past_the_budget_runs_nothing_and_keeps_the_queue(
    engine, tmp_path: Path, monkeypatch
):
    launched = fake_trials(monkeypatch)
    objective = objective_for(_space(engine), tmp_path, budget=1)
    study = _study(tmp_path)
    other = study.ask()  # another worker's trial, running: the budget's one slot
    study.enqueue_trial(
        {"max_num_seqs": 7}, user_attrs={ROLE_ATTR: "enqueued", "autotune_config": {"max_num_seqs": 7}}
    )
    study.optimize(objective, n_trials=5, catch=(OverBudget,))  # stops after its first trial
    assert not launched
    mine = study.trials[1]
    assert mine.state == optuna.trial.TrialState.FAIL and mine.user_attrs["error_type"] == "over_budget"
    assert len(study.trials) == 3
    (queued,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert queued.system_attrs["fixed_params"] == {"max_num_seqs": 7}
    assert queued.user_attrs[ROLE_ATTR] == "enqueued"
    assert counted_trials(study) == 1 and other.number == 0


def test_a_config_measured_already_is_answered_not_run_again(engine, tmp_path: Path, monkeypatch):
    from autotune.trial.record import DUPLICATE_ATTR
    from autotune.tuning.stopping import StopRules

    ran = fake_trials(monkeypatch, value=lambda spec: 10.0 + spec.engine_kwargs["enable_prefix_caching"])
    space = build_space(
        {"name": "t", "parameters": {"enable_prefix_caching": {"type": "bool"}}}, engine, source="test"
    )  # two configs in all: whatever the sampler proposes next repeats one
    objective = objective_for(space, tmp_path)
    study = _study(tmp_path)
    study.sampler = optuna.samplers.RandomSampler(seed=0)  # seeded: both values in the first two
    progress = StopRules(budget=100, max_consecutive_repeats=10)
    study.optimize(objective, n_trials=60, callbacks=[progress])
    launched = [spec.engine_kwargs for spec in ran]
    assert len(launched) == 2 and {kw["enable_prefix_caching"] for kw in launched} == {False, True}
    repeats = [t for t in study.trials if DUPLICATE_ATTR in t.user_attrs]
    assert repeats and all(
        t.value == study.trials[t.user_attrs[DUPLICATE_ATTR]].value
        and t.params == study.trials[t.user_attrs[DUPLICATE_ATTR]].params
        for t in repeats
    )
    assert counted_trials(study) == 2  # repeats cost nothing and don't use the budget
    assert progress.stopped_for_repeats and len(study.trials) < 60  # converged: the run stops


def _timeout(start: float, warmup: float | None, wall: float = 200.0):
    from autotune.trial.record import Outcome, TrialRecord

    phases = {"import": 0.0, "validate": 21.4, "engine_start": start}
    if warmup is not None:
        phases.update(warmup=warmup, generate=warmup + 0.1)
    return TrialRecord(Outcome.TIMEOUT, error_type="timeout", error="killed", wall_s=wall, phases_s=phases)


def test_a_first_trial_timed_out_by_a_cold_engine_start_runs_once_more(engine, tmp_path: Path, monkeypatch):
    from autotune.trial.record import Outcome, TrialRecord

    # the H200 case: 21 s import, 26 s validate, 146 s cold engine start, killed at 200 s in its
    # generate phase
    results = [
        _timeout(47.5, 193.5),
        TrialRecord(Outcome.SUCCESS, {"output_tokens_per_s": 5.0}, wall_s=60.0, phases_s={}),
        _timeout(47.5, 193.5),
    ]
    monkeypatch.setattr("autotune.tuning.measure.run_trial", lambda spec, **_: results.pop(0))
    study = _study(tmp_path)
    study.enqueue_trial({}, user_attrs={ROLE_ATTR: "baseline"})
    study.optimize(objective_for(_space(engine), tmp_path), n_trials=3, catch=(Exception,))
    first, retry, later = study.trials
    assert first.state == later.state == optuna.trial.TrialState.FAIL
    assert retry.user_attrs[RETRY_ATTR] == first.number and retry.user_attrs[ROLE_ATTR] == "baseline"
    assert retry.value == 5.0 and retry.params == {}
    # once warm, a timeout is the config's: no second retry; the cut-off first trial isn't counted
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert counted_trials(study) == 2


def test_a_cold_retry_is_once_and_only_for_a_timeout_spent_starting(engine, tmp_path: Path, monkeypatch):
    from autotune.study.recovery import queue_retry
    from autotune.trial.record import RETRY_REASON_ATTR

    study = _study(tmp_path)
    # a baseline the user Ctrl-C'd in its slow cold start: queued again as interrupted
    cut = study.ask()
    cut.set_user_attr(ROLE_ATTR, "baseline")
    cut.set_user_attr("error_type", "interrupted")
    queue_retry(study, cut, "interrupted")
    study.tell(cut, state=optuna.trial.TrialState.FAIL)
    # this run: the interrupted retry times out cold (retried), and so does its retry (not again)
    results = [_timeout(47.5, None), _timeout(47.5, None)]
    monkeypatch.setattr("autotune.tuning.measure.run_trial", lambda spec, **_: results.pop(0))
    study.optimize(objective_for(_space(engine), tmp_path), n_trials=2, catch=(Exception,))
    _, interrupted_retry, cold_retry = study.trials
    assert interrupted_retry.user_attrs[RETRY_REASON_ATTR] == "interrupted"
    assert cold_retry.user_attrs[RETRY_ATTR] == interrupted_retry.number
    assert "cold engine start" in cold_retry.user_attrs[RETRY_REASON_ATTR]
    assert cold_retry.state == optuna.trial.TrialState.FAIL
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    # a new run whose first trial timed out in its generate phase (a 10 s engine start): the
    # config is slow, not the caches cold, and it is not run again
    results = [_timeout(21.5, 31.5)]
    study.optimize(objective_for(_space(engine), tmp_path), n_trials=1, catch=(Exception,))
    assert study.trials[-1].user_attrs["outcome"] == "timeout"
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))
