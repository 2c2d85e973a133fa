"""The study's pruner: stops a trial that can no longer reach the completed trials' median.

Each trial reports, at every 5 % of its requests finished, an **upper bound** of its final value:
the whole workload's work (its output tokens, say, known from the baseline, which ran the same
requests) over the seconds spent so far. However fast the rest goes, the trial cannot end above
it. A sampled trial whose bound has fallen below the median of the completed trials' values is
stopped there: it cannot win, nor even reach the middle. A bound rather than the rate so far,
because a rate counts only finished requests, and a config that runs many requests at once
finishes most of them in a final burst: at 30 % of its requests it reads a third of its final
speed, and a rate-based pruner would stop exactly the configs that batch best.
"""

from __future__ import annotations

import statistics

import optuna

from autotune.trial.record import TrialRecord


class BoundPruner(optuna.pruners.BasePruner):
    """Prune a trial whose reported upper bound is below a percentile of completed values.

    Args:
        n_startup_trials: Completed trials (repeats not counted) before any pruning.
        quantile: Which quantile of the completed values the bound must reach (0.5: median).
    """

    def __init__(self, n_startup_trials: int = 5, quantile: float = 0.5) -> None:
        self.n_startup_trials, self.quantile = n_startup_trials, quantile

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or len(study.directions) != 1:
            return False
        bound = trial.intermediate_values[step]
        values = [
            t.value
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.value is not None and TrialRecord.of(t).duplicate_of is None
        ]
        if len(values) < self.n_startup_trials:
            return False
        cut = statistics.quantiles(values, n=100, method="inclusive")[round(self.quantile * 100) - 1]
        if study.direction == optuna.study.StudyDirection.MAXIMIZE:
            return bound < cut
        return bound > cut
