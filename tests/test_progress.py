from __future__ import annotations

import time

import optuna

from autotune.progress import Progress


def _study() -> optuna.Study:
    return optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))


def _objective(trial: optuna.Trial) -> float:
    time.sleep(0.2)
    return trial.suggest_float("x", 0, 1)


def test_budget_counts_launched_trials():
    study = _study()
    progress = Progress(budget=3, objective="x", show_bar=False)
    study.optimize(_objective, callbacks=[progress])
    assert len(study.trials) == 3


def test_constraint_skips_do_not_use_the_budget():
    study = _study()

    def objective(trial: optuna.Trial) -> float:
        if trial.number % 2:
            trial.set_user_attr("error_type", "constraint")
            raise optuna.TrialPruned()
        return 1.0

    progress = Progress(budget=3, objective="x", show_bar=False)
    study.optimize(objective, callbacks=[progress])
    assert len(study.trials) == 5 and progress.launched == 3


def test_all_skipped_stops():
    study = _study()

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("error_type", "constraint")
        raise optuna.TrialPruned()

    progress = Progress(budget=3, objective="x", show_bar=False, max_consecutive_skips=10)
    study.optimize(objective, callbacks=[progress])
    assert progress.stopped_for_skips and len(study.trials) == 10


def test_time_budget_starts_no_trial_that_would_overrun():
    study = _study()
    progress = Progress(budget=100, objective="x", show_bar=False, time_budget_s=0.7)
    study.optimize(_objective, callbacks=[progress])
    assert progress.stopped_for_time
    assert 2 <= len(study.trials) <= 3  # ~0.2 s each: the 4th would end past 0.7 s
