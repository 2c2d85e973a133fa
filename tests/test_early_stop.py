"""Multi-fidelity: trials report their progress to Optuna, whose pruner stops a sampled trial
that is behind at the same share of the work; queued trials always run whole."""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune.space.spec import ParamSpec, SearchSpace
from autotune.study.lifecycle import make_pruner
from autotune.trial.record import Outcome, Role, TrialRecord
from autotune.trial.runner import _stopped
from tests.helpers import objective_for

SPACE = SearchSpace("s", (ParamSpec("max_num_seqs", "int", low=1, high=1000),))


def _run_trial_at(rate_of):
    """A trial that reports ``rate_of(spec)`` at every 5 % and honours ``should_stop`` as the
    runner does; records what happened to each."""
    seen: list[tuple[int, str]] = []

    def run_trial(spec, on_progress=None, should_stop=None, **_):
        rate = rate_of(spec)
        for step in range(1, 21):
            if on_progress is not None:
                on_progress(step / 20, rate)
            if should_stop is not None and should_stop():
                seen.append((spec.engine_kwargs.get("max_num_seqs"), f"stopped at {step * 5}%"))
                events = [{"event": "progress", "share": step / 20, "output_tokens_per_s": rate}]
                outcome, error_type, error, metrics = _stopped(events)
                return TrialRecord(outcome, metrics, error_type, error, trial_dir=str(spec.trial_dir))
        seen.append((spec.engine_kwargs.get("max_num_seqs"), "whole"))
        return TrialRecord(Outcome.SUCCESS, {"output_tokens_per_s": rate}, trial_dir=str(spec.trial_dir))

    return run_trial, seen


def test_a_slow_sampled_trial_is_stopped_and_a_slow_queued_one_is_not(tmp_path: Path, monkeypatch) -> None:
    rate = {1: 50.0, 2: 1.0}  # max_num_seqs=1 and 2: far behind; the rest: 100 + n
    run_trial, seen = _run_trial_at(lambda spec: rate.get(spec.engine_kwargs["max_num_seqs"], 100.0))
    monkeypatch.setattr("autotune.tuning.measure.run_trial", run_trial)
    study = optuna.create_study(direction="maximize", pruner=make_pruner())
    for n in (500, 600, 700, 800, 900):  # five completed trials: the pruner's start-up
        study.enqueue_trial({"max_num_seqs": n})
    mine = {"max_num_seqs": 1}
    study.enqueue_trial(mine, user_attrs=TrialRecord(role=Role.ENQUEUED, config=mine).attrs())
    study.enqueue_trial({"max_num_seqs": 2})  # as the sampler would propose it (no role)
    study.optimize(objective_for(SPACE, tmp_path), n_trials=7)

    assert seen[5] == (1, "whole")  # the user's own config is measured whole, however slow
    assert seen[6] == (2, "stopped at 30%")  # no earlier than 30 % of the requests
    stopped = study.trials[6]
    record = TrialRecord.of(stopped)
    assert stopped.state is optuna.trial.TrialState.PRUNED and record.outcome is Outcome.STOPPED
    assert record.metrics == {"partial_output_tokens_per_s": 1.0, "partial_share": 0.3}
    assert "stopped at 30% of the requests" in (record.error or "") and record.counted
    assert stopped.intermediate_values[30] == 1.0 and study.best_trial.number != 6


def test_early_stop_off_runs_every_trial_whole(tmp_path: Path, monkeypatch) -> None:
    run_trial, seen = _run_trial_at(lambda spec: 1.0 if spec.engine_kwargs["max_num_seqs"] == 2 else 100.0)
    monkeypatch.setattr("autotune.tuning.measure.run_trial", run_trial)
    study = optuna.create_study(direction="maximize", pruner=make_pruner())
    for n in (500, 600, 700, 800, 900, 2):
        study.enqueue_trial({"max_num_seqs": n})
    study.optimize(objective_for(SPACE, tmp_path, early_stop=False), n_trials=6)
    assert [s for _, s in seen] == ["whole"] * 6 and not study.trials[5].intermediate_values
    assert study.trials[5].state is optuna.trial.TrialState.COMPLETE
