"""Multi-fidelity: trials report an upper bound of their final value as they go, and the study's
pruner stops a sampled trial whose bound fell below the completed trials' median; queued trials
always run whole."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.space.spec import ParamSpec, SearchSpace
from autotune.study.lifecycle import make_pruner
from autotune.trial.record import Outcome, Role, TrialRecord
from autotune.trial.runner import _PhaseWatch, _Stop, _stopped
from tests.helpers import objective_for

SPACE = SearchSpace("s", (ParamSpec("max_num_seqs", "int", low=1, high=1000),))
WORK = 1000.0  # output tokens: the baseline's 100 tok/s over 10 s


def _run_trial_at(rate_of):
    """A trial that runs at ``rate_of(spec)`` output tok/s, reports its progress every 5 % as the
    worker does, and honours ``should_stop`` as the runner does; records how each one ended."""
    seen: list[tuple[int | None, str]] = []

    def run_trial(spec, on_progress=None, should_stop=None, **_):
        rate = rate_of(spec)
        total_s = WORK / rate
        for step in range(1, 21):
            elapsed = total_s * step / 20
            if on_progress is not None:
                on_progress(step / 20, elapsed)
            if should_stop is not None and should_stop():
                seen.append((spec.engine_kwargs.get("max_num_seqs"), f"stopped at {step * 5}%"))
                event = {
                    "event": "progress",
                    "share": step / 20,
                    "elapsed": elapsed,
                    "output_tokens_per_s": rate,
                }
                outcome, error_type, error, metrics = _stopped([event])
                return TrialRecord(outcome, metrics, error_type, error, trial_dir=str(spec.trial_dir))
        seen.append((spec.engine_kwargs.get("max_num_seqs"), "whole"))
        metrics = {"output_tokens_per_s": rate, "generate_s": total_s}
        return TrialRecord(Outcome.SUCCESS, metrics, trial_dir=str(spec.trial_dir))

    return run_trial, seen


def _study(configs: list[int], queued_slow: bool = True) -> optuna.Study:
    study = optuna.create_study(direction="maximize", pruner=make_pruner())
    study.enqueue_trial({}, user_attrs=TrialRecord(role=Role.BASELINE).attrs())
    for n in configs:
        study.enqueue_trial({"max_num_seqs": n})  # as the sampler would propose them (no role)
    return study


def test_a_sampled_trial_that_cannot_reach_the_median_is_stopped(tmp_path: Path, monkeypatch) -> None:
    rates = {1: 10.0, 2: 10.0, 3: 100.0}  # the rest: 100 + n / 10
    run_trial, seen = _run_trial_at(lambda spec: rates.get(spec.engine_kwargs.get("max_num_seqs"), 100.0))
    monkeypatch.setattr("autotune.tuning.measure.run_trial", run_trial)
    study = _study([500, 600, 700, 800])  # with the baseline: five completed, the pruner's start-up
    mine = {"max_num_seqs": 1}
    study.enqueue_trial(mine, user_attrs=TrialRecord(role=Role.ENQUEUED, config=mine).attrs())
    study.enqueue_trial({"max_num_seqs": 2})
    study.enqueue_trial({"max_num_seqs": 3})
    study.optimize(objective_for(SPACE, tmp_path), n_trials=8)

    assert seen[5] == (1, "whole")  # the user's own config is measured whole, however slow
    # at 15 % after 15 s, even an instant rest gives 1000 / 15 = 67 tok/s < the median 100
    assert seen[6] == (2, "stopped at 15%")
    assert seen[7] == (3, "whole")  # as fast as the median: its bound never falls below it
    stopped = study.trials[6]
    record = TrialRecord.of(stopped)
    assert stopped.state is optuna.trial.TrialState.PRUNED and record.outcome is Outcome.STOPPED
    assert record.metrics == {
        "partial_share": 0.15,
        "partial_elapsed_s": 15.0,
        "partial_output_tokens_per_s": 10.0,
    }
    assert "stopped at 15% of its requests after 15.0 s" in (record.error or "") and record.counted
    assert stopped.intermediate_values[15] == WORK / 15.0  # the bound reported
    assert study.best_trial.number != 6


def test_nothing_is_stopped_before_five_trials_completed_or_with_early_stop_off(
    tmp_path: Path, monkeypatch
) -> None:
    run_trial, seen = _run_trial_at(
        lambda spec: 10.0 if spec.engine_kwargs.get("max_num_seqs") == 2 else 100.0
    )
    monkeypatch.setattr("autotune.tuning.measure.run_trial", run_trial)
    study = _study([500, 600, 2])  # three completed before it: too few to judge by
    study.optimize(objective_for(SPACE, tmp_path), n_trials=4)
    assert [s for _, s in seen] == ["whole"] * 4
    study = _study([500, 600, 700, 800, 2])
    study.optimize(objective_for(SPACE, tmp_path / "off", early_stop=False), n_trials=6)
    assert [s for _, s in seen[4:]] == ["whole"] * 6 and not study.trials[5].intermediate_values


def _event(**fields) -> str:
    return "\n@@autotune " + json.dumps({"pid": 7, **fields}) + "\n"


def test_a_stop_verdict_behind_the_worker_spares_a_trial_that_finished_meanwhile(tmp_path: Path) -> None:
    """The pruner's verdict rests on progress read a moment ago; a worker that has written its
    result since is not terminated (its measurement and quality probe stand). Seen in the CPU
    demo: a verdict at 50 % acted on after the result, which killed the trial in its probe."""
    out = tmp_path / "stdout.log"
    out.write_text(_event(event="progress", share=0.5, elapsed=10.0))

    def finishes_while_judged() -> bool:  # the worker writes its result while the tuner decides
        with out.open("a") as fh:
            fh.write(_event(event="result", metrics={"output_tokens_per_s": 1.0}))
        return True

    watch = _PhaseWatch(out, 7, None, lambda share, elapsed: None, finishes_while_judged)
    watch()  # no _Stop
    assert watch.measured

    behind = tmp_path / "behind.log"
    behind.write_text(_event(event="progress", share=0.5, elapsed=10.0))
    with pytest.raises(_Stop):
        _PhaseWatch(behind, 7, None, lambda share, elapsed: None, lambda: True)()
