"""The two random forests and their permutation importances, cross-validated.

A parameter's importance is the drop in the held-out score (R² for the regressor, ROC AUC for the
classifier) when its columns are permuted: repeated K-fold, every prediction made by a model that
never saw the row, the permutation drawn over the whole table. Repeats run in parallel (joblib).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any, Literal

import numpy as np

from autotune.analysis.importance._results import ModelImportance, PairImportance, ParamImportance
from autotune.analysis.importance._table import TrialTable

#: Fewer finished trials than this and no ranking is computed: it would not mean anything yet.
MIN_FINISHED = 8
#: The feasibility classifier needs this many trials of each class (feasible, infeasible).
MIN_PER_CLASS = 3
#: Below these cross-validated scores a ranking is flagged as untrustworthy.
LOW_R2 = 0.3
LOW_AUC = 0.7
#: Pairs (joint permutations) are scored when at most this many parameters vary.
MAX_PAIR_PARAMS = 16
INFEASIBLE_OUTCOMES = ("oom", "invalid", "quality")


def _model(kind: str, n_estimators: int, seed: int) -> Any:
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

    if kind == "regression":
        return RandomForestRegressor(n_estimators=n_estimators, random_state=seed, n_jobs=1)
    return RandomForestClassifier(
        n_estimators=n_estimators, random_state=seed, n_jobs=1, class_weight="balanced"
    )


def _score(kind: str, y: np.ndarray, pred: np.ndarray) -> float:
    from sklearn.metrics import r2_score, roc_auc_score

    if kind == "regression":
        return float(r2_score(y, pred))
    return float(roc_auc_score(y, pred))


def _one_repeat(
    X: np.ndarray,
    y: np.ndarray,
    variants: tuple[tuple[int, ...], ...],
    kind: str,
    n_splits: int,
    n_permutations: int,
    n_estimators: int,
    seed: int,
) -> tuple[float, np.ndarray]:
    """One repeat of K-fold: the pooled out-of-fold score, and its drop per (variant, permutation)."""
    from sklearn.model_selection import KFold, StratifiedKFold

    n = len(y)
    rng = np.random.default_rng(seed)
    shuffled = []
    for cols in variants:
        for _ in range(n_permutations):
            Xp = X.copy()
            perm = rng.permutation(n)
            Xp[:, cols] = X[perm][:, cols]
            shuffled.append(Xp)
    splitter = (
        KFold(n_splits, shuffle=True, random_state=seed)
        if kind == "regression"
        else StratifiedKFold(n_splits, shuffle=True, random_state=seed)
    )
    oof = np.empty(n)
    oof_shuffled = np.empty((len(shuffled), n))
    for train, test in splitter.split(X, y):
        model = _model(kind, n_estimators, seed).fit(X[train], y[train])
        stack = np.vstack([X[test], *(Xp[test] for Xp in shuffled)])
        if kind == "regression":
            pred = model.predict(stack)
        else:
            pred = model.predict_proba(stack)[:, list(model.classes_).index(1)]
        pred = pred.reshape(1 + len(shuffled), len(test))
        oof[test] = pred[0]
        oof_shuffled[:, test] = pred[1:]
    score = _score(kind, y, oof)
    drops = np.array([score - _score(kind, y, p) for p in oof_shuffled])
    return score, drops.reshape(len(variants), n_permutations)


def _fit_importance(
    table: TrialTable,
    rows: np.ndarray,
    y: np.ndarray,
    kind: Literal["regression", "classification"],
    *,
    n_estimators: int,
    n_repeats: int,
    n_permutations: int,
    seed: int,
    n_jobs: int,
) -> tuple[float, float, list[ParamImportance], list[PairImportance], int]:
    from joblib import Parallel, delayed

    X = table.X[rows]
    n_splits = min(5, len(y)) if kind == "regression" else min(5, int(min(np.bincount(y.astype(int)))))
    varying = [i for i, g in enumerate(table.groups) if np.ptp(X[:, list(g)], axis=0).max(initial=0) > 0]
    singles = tuple(table.groups[i] for i in varying)
    pair_idx = (
        [(a, b) for ai, a in enumerate(varying) for b in varying[ai + 1 :]]
        if 2 <= len(varying) <= MAX_PAIR_PARAMS
        else []
    )
    pairs = tuple(table.groups[a] + table.groups[b] for a, b in pair_idx)
    seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(n_repeats)]
    results = Parallel(n_jobs=n_jobs, prefer="threads")(
        delayed(_one_repeat)(X, y, singles + pairs, kind, n_splits, n_permutations, n_estimators, s)
        for s in seeds
    )
    scores = np.array([r[0] for r in results])
    drops = np.stack([r[1] for r in results])  # repeats x variants x permutations
    flat = drops.transpose(1, 0, 2).reshape(drops.shape[1], -1)
    params: list[ParamImportance] = []
    for i, f in enumerate(table.features):
        if i in varying:
            j = varying.index(i)
            params.append(ParamImportance(f.name, float(flat[j].mean()), float(flat[j].std())))
        else:
            params.append(ParamImportance(f.name, 0.0, 0.0, constant=True))
    params.sort(key=lambda p: (p.constant, -p.mean, p.name))
    ranked = [ParamImportance(**{**asdict(p), "rank": r + 1}) for r, p in enumerate(params)]
    pair_out = [
        PairImportance(
            (table.features[a].name, table.features[b].name),
            float(flat[len(singles) + k].mean()),
            float(flat[len(singles) + k].std()),
        )
        for k, (a, b) in enumerate(pair_idx)
    ]
    # a pair is worth naming when each of its members matters on its own, beyond its noise
    clear = {p.name for p in ranked if not p.constant and p.mean - p.std > 0}
    pair_out = [p for p in pair_out if set(p.names) <= clear]
    pair_out.sort(key=lambda p: -p.mean)
    return float(scores.mean()), float(scores.std()), ranked, pair_out[:3], n_splits


def objective_model(table: TrialTable, min_finished: int, study_name: str, **kw: Any) -> ModelImportance:
    rows = np.flatnonzero(table.feasible)
    n = len(rows)
    name = "random forest regressor"
    if n < min_finished:
        return ModelImportance(
            "objective",
            "too_few",
            f"only {n} finished trial(s): the ranking is not yet meaningful (it needs at least "
            f"{min_finished}); run more with `autotune run --study {study_name} --trials N`",
            n_trials=n,
            model=name,
        )
    y = table.value[rows]
    if np.ptp(y) == 0:
        return ModelImportance(
            "objective", "not_applicable", "every finished trial scored the same", n_trials=n, model=name
        )
    mean, std, params, pairs, k = _fit_importance(table, rows, y, "regression", **kw)
    warnings = []
    trust = mean >= LOW_R2
    if not trust:
        warnings.append(
            f"the surrogate explains little of the objective (cross-validated R² {mean:.2f} ± {std:.2f}, "
            f"below {LOW_R2}): do not trust this ranking yet; more trials will sharpen it"
        )
    return ModelImportance(
        "objective",
        "ok",
        f"{name} on {n} finished trials, {kw['n_repeats']} x {k}-fold",
        n_trials=n,
        model=name,
        score_name="r2",
        score_mean=mean,
        score_std=std,
        trustworthy=trust,
        params=tuple(params),
        pairs=tuple(pairs),
        warnings=tuple(warnings),
        folds=k,
        repeats=kw["n_repeats"],
    )


def feasibility_model(table: TrialTable, min_finished: int, **kw: Any) -> ModelImportance:
    n = len(table.outcome)
    y = (~table.feasible).astype(int)
    classes = dict(sorted(Counter(table.outcome).items()))
    name = "random forest classifier"
    n_bad = int(y.sum())
    if n_bad == 0:
        return ModelImportance(
            "infeasible",
            "not_applicable",
            "no trial ran out of memory, was rejected as invalid or drifted past the quality budget: "
            "nothing to explain",
            n_trials=n,
            model=name,
            classes=classes,
        )
    if n < min_finished or min(n_bad, n - n_bad) < MIN_PER_CLASS:
        return ModelImportance(
            "infeasible",
            "too_few",
            f"{n_bad} infeasible and {n - n_bad} feasible trial(s): what drives infeasibility is not yet "
            f"meaningful (it needs at least {MIN_PER_CLASS} of each and {min_finished} in all)",
            n_trials=n,
            model=name,
            classes=classes,
        )
    mean, std, params, pairs, k = _fit_importance(table, np.arange(n), y, "classification", **kw)
    warnings = []
    trust = mean >= LOW_AUC
    if not trust:
        warnings.append(
            f"the classifier separates feasible from infeasible configs poorly (cross-validated ROC AUC "
            f"{mean:.2f} ± {std:.2f}; 0.5 is chance): do not trust this ranking yet"
        )
    return ModelImportance(
        "infeasible",
        "ok",
        f"{name} on {n} trials ({n_bad} infeasible), {kw['n_repeats']} x {k}-fold stratified",
        n_trials=n,
        model=name,
        score_name="roc_auc",
        score_mean=mean,
        score_std=std,
        trustworthy=trust,
        params=tuple(params),
        pairs=tuple(pairs),
        classes=classes,
        warnings=tuple(warnings),
        folds=k,
        repeats=kw["n_repeats"],
    )
