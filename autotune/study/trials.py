"""Questions asked of a study's trials: the baseline, the best, a repeat, how many by state."""

from __future__ import annotations

from typing import Any

import optuna

from autotune.study.objectives import front, primary_value
from autotune.trial.record import INFEASIBLE, Role, TrialRecord


def baseline_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The completed baseline trial (vLLM's defaults under the fixed args), if any."""
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if TrialRecord.of(t).role is Role.BASELINE:
            return t
    return None


def baseline_value(study: optuna.Study) -> float | None:
    """The baseline's value of the study's (first) objective."""
    base = baseline_trial(study)
    return primary_value(base) if base is not None else None


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial:
    """The best completed trial; a repeat that ties with it stands for the trial it repeats.

    Raises:
        ValueError: no trial completed.
    """
    best = study.best_trial
    duplicate_of = TrialRecord.of(best).duplicate_of
    return study.trials[duplicate_of] if duplicate_of is not None else best


def best_or_none(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """:func:`best_trial`, or None while no trial has completed; of a study with several
    objectives, the point of its Pareto front best on the first."""
    if len(study.directions) != 1:
        points = front(study)
        return points[0] if points else None
    try:
        return best_trial(study)
    except ValueError:
        return None


def find_duplicate(study: optuna.Study, engine_kwargs: dict[str, Any]) -> optuna.trial.FrozenTrial | None:
    """The first trial that ran exactly ``engine_kwargs`` to a verdict already: completed, or
    pruned because the config cannot be used (out of memory, invalid, over the quality budget).

    Engine args, not params: an enqueued config may set args the space does not search. A
    constraint's skip is cheap to repeat and no measurement, so it does not count.
    """
    same = [
        t
        for t in study.get_trials(
            deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        )
        if TrialRecord.of(t).duplicate_of is None and TrialRecord.of(t).engine_kwargs == engine_kwargs
    ]
    # a measurement first: a config that ran out of memory once and completed later is usable
    for t in same:
        if t.state is optuna.trial.TrialState.COMPLETE and t.values is not None:
            return t
    for t in same:
        record = TrialRecord.of(t)
        if record.outcome in INFEASIBLE and not record.skipped:
            return t
    return None


def state_counts(study: optuna.Study) -> dict[str, int]:
    """How many trials are in each state, by state name."""
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    return counts


def ratio(value: float | None, reference: float | None) -> float | None:
    """``value / reference``; None when either is missing or the reference is 0."""
    return value / reference if value is not None and reference else None


def summary(study: optuna.Study) -> dict[str, Any]:
    """Best trial, baseline and counts of a study, as a JSON-able dict."""
    from autotune.study.settings import stored_settings

    out: dict[str, Any] = {
        "study": study.study_name,
        "objective": stored_settings(study).objective,
        "trials": state_counts(study),
    }
    best = best_or_none(study)
    if best is None:
        out["best"] = None
        return out
    out["best"] = {
        "trial": best.number,
        "value": primary_value(best),
        "engine_kwargs": TrialRecord.of(best).engine_kwargs,
    }
    if len(study.directions) > 1:
        out["objectives"] = stored_settings(study).values
        out["pareto_front"] = [{"trial": t.number, "values": t.values} for t in front(study)]
    base = baseline_trial(study)
    out["baseline_trial"] = base.number if base is not None else None
    out["baseline_value"] = primary_value(base) if base is not None else None
    out["speedup_over_baseline"] = ratio(primary_value(best), out["baseline_value"])
    # its one run and the baseline's on different GPUs or machines: the ratio is no speedup
    out["other_device"] = base is not None and TrialRecord.of(best).elsewhere_than(TrialRecord.of(base))
    return out


def failed_baseline(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The baseline that ended without a value and will not run again, while no baseline
    completed: a study in that state can compare nothing."""
    if baseline_trial(study) is not None:
        return None
    trials = study.get_trials(deepcopy=False)
    retried = {TrialRecord.of(t).retry_of for t in trials}
    for t in trials:
        record = TrialRecord.of(t)
        finished = t.state in (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
        if record.role is Role.BASELINE and finished and record.counted and t.number not in retried:
            return t
    return None


_BASELINE_HINTS = {
    "timeout": "it ran past --trial-timeout (a fresh machine's first engine start compiles the model); "
    "raise --trial-timeout and run the same command: the baseline runs again first",
    "crash": "read its log; once the cause is fixed, the same command runs the baseline again first",
    "oom": "vLLM's defaults do not fit here; fix what they lack for every trial, e.g. --set "
    "max_model_len=4096 or --set gpu_memory_utilization=0.8 (on the CPU backend --set "
    "kv_cache_memory_bytes=..., or the bundled cpu space)",
    "invalid": "vLLM rejects its defaults under the fixed args; change the --set or fixed: args",
}


def baseline_failure_message(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> str:
    """Why a study whose baseline failed cannot go on, and what to do."""
    record = TrialRecord.of(trial)
    error = " ".join(str(record.error or "no error recorded").split())
    kind = record.outcome.value if record.outcome else trial.state.name.lower()
    hint = _BASELINE_HINTS.get(kind, _BASELINE_HINTS["crash"])
    if kind in ("oom", "invalid"):
        hint += "; then start a new --study (the fixed args are the study's)"
    return (
        f"the baseline (trial #{trial.number}, vLLM's defaults under the fixed args) failed, so no "
        f"config can be compared with it: [{record.error_type or kind}] {error[:400]}. {hint} "
        f"(log: {record.log or record.trial_dir or '-'})"
    )
