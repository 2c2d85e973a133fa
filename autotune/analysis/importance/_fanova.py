"""Optuna's fANOVA on the same trials, and where it disagrees with the surrogate's ranking."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from autotune.analysis.importance._results import FanovaResult, ModelImportance
from autotune.analysis.importance._surrogates import MIN_FINISHED
from autotune.analysis.importance._table import _union
from autotune.trial.record import TrialRecord

if TYPE_CHECKING:
    import optuna


def _merge(dists: list[Any]) -> Any | None:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    first = dists[0]
    if all(d == first for d in dists):
        return first
    if all(isinstance(d, FloatDistribution) for d in dists):
        log = all(d.log for d in dists)
        return FloatDistribution(min(d.low for d in dists), max(d.high for d in dists), log=log)
    if all(isinstance(d, IntDistribution) for d in dists):
        log = all(d.log for d in dists)
        steps = {d.step for d in dists}
        step = steps.pop() if len(steps) == 1 and not log else 1
        return IntDistribution(min(d.low for d in dists), max(d.high for d in dists), log=log, step=step)
    if all(isinstance(d, CategoricalDistribution) for d in dists):
        return CategoricalDistribution(_union([c for d in dists for c in d.choices]))
    return None


def _cover(dist: Any, values: list[Any]) -> Any:
    """``dist`` widened to hold every value a trial recorded: a queued trial records what vLLM
    resolved (``tuning/resolved.py``), which may lie outside the range or off its step."""
    from optuna.distributions import FloatDistribution, IntDistribution

    if not isinstance(dist, (FloatDistribution, IntDistribution)):  # None included: no merge
        return dist
    step = dist.step or 0

    def inside(v: float) -> bool:
        on_step = not step or abs((v - dist.low) / step - round((v - dist.low) / step)) < 1e-6
        return dist.low <= v <= dist.high and on_step

    if all(inside(v) for v in values):
        return dist
    low, high = min(dist.low, *values), max(dist.high, *values)
    log = dist.log and low > 0
    if isinstance(dist, IntDistribution):
        return IntDistribution(int(low), int(high), log=log)
    return FloatDistribution(float(low), float(high), log=log)


def fanova_importance(
    study: optuna.Study, *, min_finished: int = MIN_FINISHED, seed: int = 0
) -> FanovaResult:
    """Optuna's fANOVA over the parameters every finished trial has, normalised to sum 1.

    A trial without params (a baseline of a study from before queued trials recorded what vLLM
    resolved) and trials of older spaces are what ``params=`` must exclude, so it runs on an
    in-memory copy holding just those trials and the merged distributions.
    """
    import optuna
    from optuna.importance import FanovaImportanceEvaluator

    trials = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.params and t.values and math.isfinite(t.values[0]) and TrialRecord.of(t).duplicate_of is None
    ]
    if len(trials) < min_finished:
        return FanovaResult(
            "too_few", f"{len(trials)} finished trial(s); fANOVA needs {min_finished}", len(trials)
        )
    common = set.intersection(*(set(t.params) for t in trials))
    merged = {
        n: _cover(_merge([t.distributions[n] for t in trials]), [t.params[n] for t in trials])
        for n in sorted(common)
    }
    dists = {n: d for n, d in merged.items() if d is not None and not d.single()}
    if not dists:
        return FanovaResult("not_applicable", "no parameter is searched in every finished trial", len(trials))
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        copy = optuna.create_study(direction=study.directions[0])  # the (first) objective
        copy.add_trials(
            optuna.trial.create_trial(
                params={n: t.params[n] for n in dists}, distributions=dists, value=t.values[0]
            )
            for t in trials
        )
        raw = FanovaImportanceEvaluator(seed=seed).evaluate(copy)
    except (ValueError, RuntimeError) as e:
        return FanovaResult("error", f"fANOVA failed: {e}", len(trials))
    finally:
        optuna.logging.set_verbosity(verbosity)
    total = float(sum(raw.values()))
    shares = {n: (float(v) / total if total > 0 else 0.0) for n, v in raw.items()}
    return FanovaResult(
        "ok", f"fANOVA (Optuna, 64 trees) on {len(trials)} finished trials", len(trials), shares
    )


def compare_with_fanova(
    model: ModelImportance, fanova: FanovaResult
) -> tuple[ModelImportance, float | None, list[str]]:
    """Attach fANOVA's shares to the ranking; the rank correlation and where the two disagree.

    A disagreement is a parameter that one method gives at least 10 % of the total and that the
    other ranks 3+ places apart or gives a share more than 0.25 away; and a different top
    parameter. Ranks among parameters both find negligible are noise and are not compared.
    """
    from scipy.stats import spearmanr

    if model.status != "ok" or fanova.status != "ok":
        return model, None, []
    names = [p.name for p in model.params if p.name in fanova.shares]
    if len(names) < 2:
        return model, None, []
    total = sum(max(p.mean, 0.0) for p in model.params if p.name in names)
    ours = {p.name: (max(p.mean, 0.0) / total if total > 0 else 0.0) for p in model.params if p.name in names}
    theirs = {n: fanova.shares[n] for n in names}
    a, b = [ours[n] for n in names], [theirs[n] for n in names]
    rho = float(spearmanr(a, b).statistic) if len(set(a)) > 1 and len(set(b)) > 1 else None
    ranked_f = {n: i + 1 for i, n in enumerate(sorted(names, key=lambda n: -theirs[n]))}
    by_name = {p.name: p for p in model.params}
    params = tuple(
        dataclasses.replace(p, fanova=fanova.shares.get(p.name), fanova_rank=ranked_f.get(p.name))
        for p in model.params
    )
    lines = []
    top_ours, top_theirs = max(names, key=lambda n: ours[n]), max(names, key=lambda n: theirs[n])
    if top_ours != top_theirs:
        lines.append(
            f"the top parameter: the surrogate ranks {top_ours} first, fANOVA {top_theirs} "
            f"({theirs[top_theirs]:.0%} of the variance)"
        )
    for n in names:
        rs, rf = by_name[n].rank, ranked_f[n]
        material = max(ours[n], theirs[n]) >= 0.10
        if material and (abs(rs - rf) >= 3 or abs(ours[n] - theirs[n]) > 0.25):
            p = by_name[n]
            lines.append(
                f"{n}: fANOVA ranks it #{rf} ({theirs[n]:.0%} of the variance), the surrogate #{rs} "
                f"(R² drop {p.mean:.3f} ± {p.std:.3f}, {ours[n]:.0%} of the total)"
            )
    return dataclasses.replace(model, params=params), rho, lines
