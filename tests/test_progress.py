from __future__ import annotations

import time

import optuna
import pytest

from autotune.tuning.progress import Progress
from autotune.tuning.stopping import StopRules


def _study() -> optuna.Study:
    return optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))


def _objective(trial: optuna.Trial) -> float:
    time.sleep(0.2)
    return trial.suggest_float("x", 0, 1)


def test_budget_counts_launched_trials():
    study = _study()
    progress = StopRules(budget=3)
    study.optimize(_objective, callbacks=[progress])
    assert len(study.trials) == 3


def test_constraint_skips_do_not_use_the_budget():
    study = _study()

    def objective(trial: optuna.Trial) -> float:
        if trial.number % 2:
            trial.set_user_attr("error_type", "constraint")
            raise optuna.TrialPruned()
        return 1.0

    progress = StopRules(budget=3)
    study.optimize(objective, callbacks=[progress])
    assert len(study.trials) == 5 and progress.launched == 3


def test_all_skipped_stops():
    study = _study()

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("error_type", "constraint")
        raise optuna.TrialPruned()

    progress = StopRules(budget=3, max_consecutive_skips=10)
    study.optimize(objective, callbacks=[progress])
    assert progress.stopped_for_skips and len(study.trials) == 10


def test_time_budget_starts_no_trial_that_would_overrun():
    study = _study()
    progress = StopRules(budget=100, time_budget_s=0.7)
    study.optimize(_objective, callbacks=[progress])
    assert progress.stopped_for_time
    assert 2 <= len(study.trials) <= 3  # ~0.2 s each: the 4th would end past 0.7 s


def _timed_objective(monkeypatch, walls: list[float]):
    """An objective whose trials take ``walls`` seconds each on a fake clock that starts at 0."""
    clock = [0.0]
    monkeypatch.setattr("autotune.tuning.stopping.time.time", lambda: clock[0])
    lengths = iter(walls)

    def objective(trial: optuna.Trial) -> float:
        clock[0] += next(lengths)
        return trial.suggest_float("x", 0, 1)

    return objective


def test_time_budget_is_not_spent_by_a_cold_first_trial(monkeypatch):
    # a machine's first trial pays for cold caches (the H200's: 207 s, then ~87 s): the next
    # trial's length is the median of those so far, not the mean
    objective = _timed_objective(monkeypatch, [200.0] + [90.0] * 20)
    progress = StopRules(budget=100, time_budget_s=490, started=0.0)
    _study().optimize(objective, callbacks=[progress])
    assert progress.stopped_for_time
    assert progress.launched == 4  # ends at 470 s; the mean (127 s after 3) stopped at 3


def test_a_study_from_before_stored_budgets_gets_the_default():
    from autotune.study.settings import BUDGET_ATTR, DEFAULT_TRIALS, budget

    study = _study()
    assert budget(study) == DEFAULT_TRIALS  # not 0: "17 of 0 trials done" on the H200
    study.set_user_attr(BUDGET_ATTR, 12)
    assert budget(study) == 12


def test_a_resumed_study_judges_the_time_left_by_its_earlier_trials(monkeypatch):
    # on the H200 a fresh machine's first trial took 226 s, warm ones ~100 s: a resume with 440 s
    # must not stop after that one trial when the study already knows what a trial costs
    objective = _timed_objective(monkeypatch, [226.0] + [100.0] * 20)
    progress = StopRules(
        budget=100,
        time_budget_s=440,
        started=0.0,
        earlier_walls=[108, 116, 107],
    )
    _study().optimize(objective, callbacks=[progress])
    assert progress.stopped_for_time and progress.launched == 3  # 226 + 100 + 100, then 526 > 440


def test_a_short_measurement_is_flagged_once(monkeypatch):
    import autotune.tuning.progress

    warnings: list[str] = []
    monkeypatch.setattr(autotune.tuning.progress._logger, "warning", lambda msg, *a: warnings.append(msg % a))
    study = _study()

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("metrics", {"generate_s": 30.0 if trial.number == 0 else 8.0})
        return 1.0

    study.optimize(objective, n_trials=3, callbacks=[Progress(budget=3, objective="x", show_bar=False)])
    (warning,) = warnings
    assert "trial #1" in warning and "8.0 s" in warning and "count=" in warning


def test_a_fresh_studys_cold_first_trial_is_not_taken_for_what_trials_cost(monkeypatch):
    # the H200, a fresh 1B study, --time-budget 400: the baseline took 200 s, 146 s of them a cold
    # engine start; warm trials took ~70 s. Judged by the cold 200 s, the run stopped after it.
    clock = [0.0]
    monkeypatch.setattr("autotune.tuning.stopping.time.time", lambda: clock[0])

    def objective(trial: optuna.Trial) -> float:
        cold = trial.number == 0
        clock[0] += 200.0 if cold else 70.0
        start = (47.5, 193.5) if cold else (22.0, 50.0)
        trial.set_user_attr("phases_s", {"engine_start": start[0], "warmup": start[1]})
        return trial.suggest_float("x", 0, 1)

    progress = StopRules(budget=100, time_budget_s=400, started=0.0)
    _study().optimize(objective, callbacks=[progress])
    # 200 s - 146 s x 0.65 = 105 s predicted: a second trial fits; then median(105, 70) = 87.5
    assert progress.stopped_for_time and progress.launched == 3  # 200 + 70 + 70 = 340, + 70 > 400


def test_with_parallel_slots_a_trial_is_as_long_as_its_own_wall(monkeypatch):
    # two slots, both cold (146 s starts), ending 5 s apart: each is predicted from its own wall
    # with a warm start (105 s), not from the 5 s between the two ends
    clock = [0.0]
    monkeypatch.setattr("autotune.tuning.stopping.time.time", lambda: clock[0])
    ends = iter([200.0, 205.0, 280.0, 285.0, 360.0, 365.0])

    def objective(trial: optuna.Trial) -> float:
        clock[0] = next(ends)
        cold = trial.number < 2
        trial.set_user_attr("wall_s", 200.0 if cold else 75.0)
        trial.set_user_attr("phases_s", {"engine_start": 47.5, "warmup": 193.5 if cold else 75.5})
        return trial.suggest_float("x", 0, 1)

    progress = StopRules(budget=100, time_budget_s=400, started=0.0, parallel=2)
    _study().optimize(objective, callbacks=[progress])
    assert progress._trial_walls[:2] == [pytest.approx(105.1), pytest.approx(105.1)]
    # after 4 trials: median(105.1, 105.1, 75, 75) = 90.05; 285 + 90 fits, after 5: 360 + 75 doesn't
    assert progress.stopped_for_time and progress.launched == 5


def test_a_trial_measured_on_another_device_than_the_baseline_says_so(monkeypatch):
    import autotune.tuning.progress

    lines: list[str] = []
    monkeypatch.setattr(autotune.tuning.progress._logger, "info", lambda msg, *a: lines.append(msg % a))
    study = _study()

    def objective(trial: optuna.Trial) -> float:
        if trial.number == 0:
            trial.set_user_attr("autotune_role", "baseline")
        gpu = "GPU-a" if trial.number < 2 else "GPU-b"  # the study resumed on another machine
        trial.set_user_attr("machine", {"host": "h", "gpu_uuids": [gpu]})
        return 100.0 + trial.number

    study.optimize(objective, n_trials=3, callbacks=[Progress(budget=3, objective="x", show_bar=False)])
    trials = [line for line in lines if line.startswith("trial ")]
    assert "(x1.01 vs defaults)" in trials[1]
    assert "(x1.02 vs the defaults' run on another device)" in trials[2]
