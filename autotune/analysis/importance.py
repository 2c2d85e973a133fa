"""What drives the objective, and what drives the OOMs: scikit-learn surrogates fitted on a study's
trials, with uncertainty, cross-checked against Optuna's fANOVA.

Two random forests share one feature table (log-scaled parameters in log space, booleans as 0/1,
numeric choices as ordinals, other categoricals one-hot):

* a **regressor** on the finished trials, objective ~ params, the baseline included (its params
  are vLLM's resolved defaults);
* a **classifier** on every trial that ran or that vLLM rejected: feasible vs infeasible (out of
  memory, or a config vLLM refuses). Trials skipped by the space's own constraints never ran and
  are left out; so are crashes and timeouts whose error does not read as either.

A parameter's importance is the drop in the held-out score (R² for the regressor, ROC AUC for the
classifier) when its columns are permuted: repeated K-fold, every prediction made by a model that
never saw the row, the permutation drawn over the whole table (a 2-row test fold permuted alone
says nothing). Mean ± sd are over repeats x permutations; the repeats run in parallel (joblib).
The model's own cross-validated score comes with it, so nobody trusts a ranking built on a model
that explains nothing.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from autotune._logging import get_logger
from autotune.analysis.records import resolved_value
from autotune.errors import AutotuneError
from autotune.study.lifecycle import ROLE_ATTR, SETTINGS_ATTR

if TYPE_CHECKING:
    import optuna

_logger = get_logger(__name__)

#: Fewer finished trials than this and no ranking is computed: it would not mean anything yet.
MIN_FINISHED = 8
#: The feasibility classifier needs this many trials of each class (feasible, infeasible).
MIN_PER_CLASS = 3
#: Below these cross-validated scores a ranking is flagged as untrustworthy.
LOW_R2 = 0.3
LOW_AUC = 0.7
#: Pairs (joint permutations) are scored when at most this many parameters vary.
MAX_PAIR_PARAMS = 16
INFEASIBLE_OUTCOMES = ("oom", "invalid")

Status = Literal["ok", "too_few", "not_applicable", "error"]
FeatureKind = Literal["numeric", "bool", "ordinal", "onehot"]


class ImportanceError(AutotuneError):
    """Parameter importance cannot be computed (a missing dependency, an unusable study)."""


@dataclass(frozen=True)
class Feature:
    """One searched parameter and how it is encoded for the surrogates."""

    name: str
    kind: FeatureKind
    log: bool = False
    choices: tuple[Any, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """Names of the encoded columns (one, or one per choice for one-hot)."""
        if self.kind == "onehot":
            return tuple(f"{self.name}={c!r}" for c in self.choices)
        return (self.name,)

    def encode(self, value: Any) -> list[float] | None:
        """The encoded columns of ``value``; None when it cannot be encoded (it gets imputed)."""
        if value is None and self.kind in ("numeric", "bool"):
            return None
        if self.kind == "bool":
            return [1.0 if bool(value) else 0.0]
        if self.kind == "numeric":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return None
            if self.log:
                return [math.log10(value)] if value > 0 else None
            return [float(value)]
        keys = [_key(c) for c in self.choices]
        try:
            index = keys.index(_key(value))
        except ValueError:
            return None
        if self.kind == "ordinal":
            return [float(index)]
        return [1.0 if i == index else 0.0 for i in range(len(self.choices))]


@dataclass(frozen=True)
class TrialTable:
    """The trials a surrogate learns from, one row each.

    Attributes:
        features: The parameters, in column order.
        groups: For each feature, the indices of its encoded columns in ``X``.
        X: Encoded parameter values (missing ones imputed), rows x columns.
        numbers: Trial number of each row.
        value: Objective value of each row; NaN where the trial was infeasible.
        outcome: ``success``, ``oom`` or ``invalid`` for each row.
        raw: Each row's parameter values as run (None where unknown), for plots and tables.
        imputed: Per parameter, how many rows had no known value and got the column's median/mode.
        notes: What was left out and why, in words.
    """

    features: tuple[Feature, ...]
    groups: tuple[tuple[int, ...], ...]
    X: np.ndarray
    numbers: tuple[int, ...]
    value: np.ndarray
    outcome: tuple[str, ...]
    raw: tuple[dict[str, Any], ...]
    imputed: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def feasible(self) -> np.ndarray:
        return np.array([o == "success" for o in self.outcome], dtype=bool)


@dataclass(frozen=True)
class ParamImportance:
    """One parameter's importance: the held-out score drop when it is permuted."""

    name: str
    mean: float
    std: float
    rank: int = 0
    constant: bool = False
    fanova: float | None = None
    fanova_rank: int | None = None


@dataclass(frozen=True)
class PairImportance:
    """Two parameters permuted together: what they explain jointly."""

    names: tuple[str, str]
    mean: float
    std: float


@dataclass(frozen=True)
class ModelImportance:
    """A surrogate's cross-validated score and its ranking of the parameters."""

    target: Literal["objective", "infeasible"]
    status: Status
    message: str
    n_trials: int = 0
    model: str = ""
    score_name: str = ""
    score_mean: float | None = None
    score_std: float | None = None
    trustworthy: bool = False
    params: tuple[ParamImportance, ...] = ()
    pairs: tuple[PairImportance, ...] = ()
    classes: dict[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    folds: int = 0
    repeats: int = 0

    def top(self, k: int = 1) -> list[str]:
        """Names of the ``k`` most important parameters (empty unless ``status`` is ok)."""
        return [p.name for p in self.params[:k]] if self.status == "ok" else []


@dataclass(frozen=True)
class FanovaResult:
    """Optuna's fANOVA on the same study: shares of the objective's variance per parameter."""

    status: Status
    message: str
    n_trials: int = 0
    shares: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportanceReport:
    """Everything ``autotune importance`` knows about a study; :meth:`to_dict` goes in exports."""

    study: str
    objective: str
    objective_model: ModelImportance
    feasibility_model: ModelImportance
    fanova: FanovaResult
    spearman_vs_fanova: float | None = None
    disagreements: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    method: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form, stored under ``importance`` in the export document."""
        return dict(_jsonable(asdict(self)))


# ---------------------------------------------------------------------------------------------
# the feature table


def _key(value: Any) -> tuple[str, Any]:
    """A type-aware identity for a choice (True is not 1, 16 is 16.0)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", float(value))
    if value is None or isinstance(value, str):
        return (type(value).__name__, value)
    return ("repr", repr(value))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _union(values: Sequence[Any]) -> tuple[Any, ...]:
    seen: dict[tuple[str, Any], Any] = {}
    for v in values:
        seen.setdefault(_key(v), v)
    return tuple(seen.values())


def infeasible_kind(trial: optuna.trial.FrozenTrial) -> str | None:
    """``oom`` or ``invalid`` when the trial shows the config cannot run; None otherwise.

    A crash whose stored error reads as an OOM or an invalid config under today's patterns
    (:mod:`autotune.trial.outcome`) counts as that: studies recorded before a pattern existed keep
    their evidence. Trials the space's own constraints skipped never ran and return None.
    """
    import optuna

    from autotune.trial.outcome import Outcome, classify

    if trial.state not in (optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL):
        return None
    attrs = trial.user_attrs
    if attrs.get("error_type") == "constraint":
        return None
    outcome = attrs.get("outcome")
    if outcome in INFEASIBLE_OUTCOMES:
        return str(outcome)
    if outcome is None and trial.state == optuna.trial.TrialState.PRUNED and not attrs.get("error"):
        return "invalid"  # pruned by hand or by an older tuner: the config was judged unusable
    error = attrs.get("error")
    if not error:
        return None
    event = {"event": "error", "error": str(error), "error_type": str(attrs.get("error_type") or "")}
    again, _, _, _ = classify(returncode=1, timed_out=outcome == "timeout", events=[event], stderr_tail="")
    if again in (Outcome.OOM, Outcome.INVALID):
        return again.value
    return None


def _feature_for(name: str, dists: list[Any], observed: list[Any]) -> Feature:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if dists and all(isinstance(d, (FloatDistribution, IntDistribution)) for d in dists):
        return Feature(name, "numeric", log=all(d.log for d in dists))
    choices: list[Any] = []
    for d in dists:
        if isinstance(d, CategoricalDistribution):
            choices.extend(d.choices)
    choices = list(_union([*choices, *(v for v in observed if v is not None)]))
    if choices and all(isinstance(c, bool) for c in choices):
        return Feature(name, "bool", choices=(False, True))
    if choices and all(_is_number(c) for c in choices):
        return Feature(name, "ordinal", choices=tuple(sorted(choices)))
    if len(choices) <= 2:
        return Feature(name, "ordinal", choices=tuple(choices))
    return Feature(name, "onehot", choices=tuple(choices))


def trial_table(study: optuna.Study) -> TrialTable:
    """The feature table of a study's usable trials (see the module docstring for which).

    Parameters are those any trial searched (a knob dropped from the space later still explains
    the trials that ran with it); a trial that did not search one ran it at its resolved value,
    or vLLM's default from the baseline's resolved config.
    """
    import optuna

    from autotune.study.lifecycle import DUPLICATE_ATTR, baseline_trial

    base = baseline_trial(study)
    defaults = dict(base.user_attrs.get("engine") or {}) if base is not None else {}
    notes: list[str] = []
    rows: list[tuple[optuna.trial.FrozenTrial, str]] = []
    skipped: Counter[str] = Counter()
    for t in study.get_trials(deepcopy=False):
        if DUPLICATE_ATTR in t.user_attrs:
            skipped["duplicate"] += 1  # the same row as the trial it repeats
            continue
        if t.state == optuna.trial.TrialState.COMPLETE:
            if t.value is not None and math.isfinite(t.value):
                rows.append((t, "success"))
            continue
        if t.state not in (optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL):
            continue
        kind = infeasible_kind(t)
        if kind is not None:
            if t.user_attrs.get("outcome") not in INFEASIBLE_OUTCOMES and t.state.name == "FAIL":
                skipped[f"reread:{kind}"] += 1
            rows.append((t, kind))
        elif t.user_attrs.get("error_type") == "constraint":
            skipped["constraint"] += 1
        else:
            skipped[str(t.user_attrs.get("outcome") or t.state.name.lower())] += 1
    if skipped.get("constraint"):
        notes.append(f"{skipped.pop('constraint')} trial(s) skipped by the space's constraints left out")
    for what, n in sorted(skipped.items()):
        if what.startswith("reread:"):
            kind = what.split(":", 1)[1]
            notes.append(
                f"{n} failed trial(s) counted as {kind}: recorded as crashes, their stored error "
                f"matches today's {kind} patterns (autotune.trial.outcome)"
            )
        else:
            notes.append(
                f"{n} {what} trial(s) left out of the feasibility model (not an OOM or invalid config)"
            )

    dists: dict[str, list[Any]] = {}
    for t, _ in rows:
        for name, d in t.distributions.items():
            dists.setdefault(name, []).append(d)
    settings = study.user_attrs.get(SETTINGS_ATTR) or {}
    space_params = list((settings.get("space") or {}).get("parameters") or {})
    names = [n for n in space_params if n in dists] + sorted(n for n in dists if n not in space_params)

    raw_rows: list[dict[str, Any]] = []
    kept: list[tuple[optuna.trial.FrozenTrial, str]] = []
    for t, kind in rows:
        values = {n: resolved_value(t, n, defaults) for n in names}
        if t.user_attrs.get(ROLE_ATTR) == "baseline" and any(v is None for v in values.values()):
            notes.append(f"baseline trial #{t.number} left out: its resolved config lacks some parameters")
            continue
        raw_rows.append(values)
        kept.append((t, kind))

    features = tuple(_feature_for(n, dists[n], [r[n] for r in raw_rows]) for n in names)
    columns: list[list[float]] = [[] for _ in raw_rows]
    groups: list[tuple[int, ...]] = []
    imputed: dict[str, int] = {}
    width = 0
    for f in features:
        encoded = [f.encode(r[f.name]) for r in raw_rows]
        known = [e for e in encoded if e is not None]
        fill = _fill(f, known)
        missing = sum(e is None for e in encoded)
        if missing:
            imputed[f.name] = missing
        for row, e in zip(columns, encoded, strict=True):
            row.extend(e if e is not None else fill)
        groups.append(tuple(range(width, width + len(f.columns))))
        width += len(f.columns)
    if imputed:
        notes.append(
            "no known value, imputed (median or most frequent): "
            + ", ".join(f"{k} in {v} trial(s)" for k, v in imputed.items())
        )
    X = np.array(columns, dtype=float).reshape(len(raw_rows), width)
    value = np.array([t.value if kind == "success" else np.nan for t, kind in kept], dtype=float)
    return TrialTable(
        features=features,
        groups=tuple(groups),
        X=X,
        numbers=tuple(t.number for t, _ in kept),
        value=value,
        outcome=tuple(kind for _, kind in kept),
        raw=tuple(raw_rows),
        imputed=imputed,
        notes=tuple(notes),
    )


def _fill(feature: Feature, known: list[list[float]]) -> list[float]:
    width = len(feature.columns)
    if not known:
        return [0.0] * width
    if feature.kind == "numeric":
        return [float(np.median([k[0] for k in known]))]
    common, _ = Counter(tuple(k) for k in known).most_common(1)[0]
    return list(common)


# ---------------------------------------------------------------------------------------------
# the surrogates


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


def _objective_model(table: TrialTable, min_finished: int, study_name: str, **kw: Any) -> ModelImportance:
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


def _feasibility_model(table: TrialTable, min_finished: int, **kw: Any) -> ModelImportance:
    n = len(table.outcome)
    y = (~table.feasible).astype(int)
    classes = dict(sorted(Counter(table.outcome).items()))
    name = "random forest classifier"
    n_bad = int(y.sum())
    if n_bad == 0:
        return ModelImportance(
            "infeasible",
            "not_applicable",
            "no trial ran out of memory or was rejected as invalid: nothing to explain",
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


# ---------------------------------------------------------------------------------------------
# fANOVA, the cross-check


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


def fanova_importance(
    study: optuna.Study, *, min_finished: int = MIN_FINISHED, seed: int = 0
) -> FanovaResult:
    """Optuna's fANOVA over the parameters every finished sampled trial has, normalised to sum 1.

    The baseline (no params) and trials of older spaces are what ``params=`` must exclude, so it
    runs on an in-memory copy holding just those trials and the merged distributions.
    """
    import optuna
    from optuna.importance import FanovaImportanceEvaluator

    from autotune.study.lifecycle import DUPLICATE_ATTR

    trials = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.params and t.value is not None and math.isfinite(t.value) and DUPLICATE_ATTR not in t.user_attrs
    ]
    if len(trials) < min_finished:
        return FanovaResult(
            "too_few", f"{len(trials)} finished sampled trial(s); fANOVA needs {min_finished}", len(trials)
        )
    common = set.intersection(*(set(t.params) for t in trials))
    merged = {n: _merge([t.distributions[n] for t in trials]) for n in sorted(common)}
    dists = {n: d for n, d in merged.items() if d is not None and not d.single()}
    if not dists:
        return FanovaResult("not_applicable", "no parameter is searched in every finished trial", len(trials))
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        copy = optuna.create_study(direction=study.direction)
        copy.add_trials(
            optuna.trial.create_trial(
                params={n: t.params[n] for n in dists}, distributions=dists, value=t.value
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
        "ok", f"fANOVA (Optuna, 64 trees) on {len(trials)} finished sampled trials", len(trials), shares
    )


def _ranks(values: dict[str, float]) -> dict[str, float]:
    """Average ranks, 1 = largest."""
    order = sorted(values, key=lambda n: -values[n])
    ranks: dict[str, float] = {}
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and math.isclose(values[order[j + 1]], values[order[i]], abs_tol=1e-12):
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def compare_with_fanova(
    model: ModelImportance, fanova: FanovaResult
) -> tuple[ModelImportance, float | None, list[str]]:
    """Attach fANOVA's shares to the ranking; the rank correlation and where the two disagree.

    A disagreement is a parameter that one method gives at least 10 % of the total and that the
    other ranks 3+ places apart or gives a share more than 0.25 away; and a different top
    parameter. Ranks among parameters both find negligible are noise and are not compared.
    """
    if model.status != "ok" or fanova.status != "ok":
        return model, None, []
    names = [p.name for p in model.params if p.name in fanova.shares]
    if len(names) < 2:
        return model, None, []
    total = sum(max(p.mean, 0.0) for p in model.params if p.name in names)
    ours = {p.name: (max(p.mean, 0.0) / total if total > 0 else 0.0) for p in model.params if p.name in names}
    theirs = {n: fanova.shares[n] for n in names}
    r_ours, r_theirs = _ranks(ours), _ranks(theirs)
    a = np.array([r_ours[n] for n in names])
    b = np.array([r_theirs[n] for n in names])
    rho = float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else None
    ranked_f = {n: i + 1 for i, n in enumerate(sorted(names, key=lambda n: -theirs[n]))}
    by_name = {p.name: p for p in model.params}
    params = tuple(
        ParamImportance(
            **{**asdict(p), "fanova": fanova.shares.get(p.name), "fanova_rank": ranked_f.get(p.name)}
        )
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
    return ModelImportance(**{**_shallow(model), "params": params}), rho, lines


def _shallow(obj: Any) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in obj.__dataclass_fields__}


# ---------------------------------------------------------------------------------------------
# the entry point


def compute_importance(
    study: optuna.Study,
    *,
    n_estimators: int = 100,
    n_repeats: int = 5,
    n_permutations: int = 3,
    seed: int = 0,
    n_jobs: int = -1,
    min_finished: int = MIN_FINISHED,
    fanova: bool = True,
) -> ImportanceReport:
    """Rank what drives a study's objective and what drives its infeasible configs.

    Args:
        study: An autotune study (any Optuna study whose trials are single-objective works).
        n_estimators: Trees per random forest.
        n_repeats: Repeats of K-fold (K = 5, fewer with fewer trials); each gives one score.
        n_permutations: Permutations per parameter and repeat.
        seed: Makes the whole computation reproducible, whatever ``n_jobs``.
        n_jobs: Repeats fitted at once (joblib threads; -1 = one per core). Results do not
            depend on it.
        min_finished: Below this many finished trials no ranking is computed.
        fanova: Also run Optuna's fANOVA and say where it disagrees.

    Returns:
        The report; models that could not be fitted say why in their ``message``.

    Raises:
        ImportanceError: scikit-learn is not installed, or the study is multi-objective.
    """
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise ImportanceError(
            "parameter importance needs scikit-learn: pip install 'scikit-learn>=1.3'"
        ) from None
    if len(study.directions) != 1:
        raise ImportanceError(f"study {study.study_name!r} has several objectives; importance needs one")
    started = time.perf_counter()
    settings = study.user_attrs.get(SETTINGS_ATTR) or {}
    table = trial_table(study)
    kw: dict[str, Any] = {
        "n_estimators": n_estimators,
        "n_repeats": n_repeats,
        "n_permutations": n_permutations,
        "seed": seed,
        "n_jobs": n_jobs,
    }
    objective_model = _objective_model(table, min_finished, study.study_name, **kw)
    feasibility_model = _feasibility_model(table, min_finished, **kw)
    fan = (
        fanova_importance(study, min_finished=min_finished, seed=seed)
        if fanova
        else FanovaResult("not_applicable", "not asked for")
    )
    objective_model, rho, disagreements = compare_with_fanova(objective_model, fan)
    elapsed = time.perf_counter() - started
    _logger.debug("importance of %s in %.1f s", study.study_name, elapsed)
    return ImportanceReport(
        study=study.study_name,
        objective=str(settings.get("objective", "objective")),
        objective_model=objective_model,
        feasibility_model=feasibility_model,
        fanova=fan,
        spearman_vs_fanova=rho,
        disagreements=tuple(disagreements),
        notes=table.notes,
        method={
            **{k: v for k, v in kw.items() if k != "n_jobs"},
            "importance": "drop in the held-out score when the parameter is permuted; "
            "mean ± sd over repeats x permutations",
            "encoding": {f.name: f.kind + (" (log10)" if f.log else "") for f in table.features},
        },
        elapsed_s=elapsed,
    )


def export_importance(study: optuna.Study, **kwargs: Any) -> tuple[dict[str, Any], str]:
    """:func:`compute_importance` for an export: its ``importance`` entry and the terminal table.

    Never raises: an export must not fail because the ranking could not be computed; the entry
    then holds ``{"status": "error", "message": ...}`` and the text says the same.
    """
    try:
        report = compute_importance(study, **kwargs)
    except AutotuneError as e:
        return {"status": "error", "message": str(e)}, f"parameter importance: {e}"
    except Exception as e:  # a bug in the ranking must not cost the user their export
        _logger.warning("importance failed: %s: %s", type(e).__name__, e)
        message = f"{type(e).__name__}: {e}"
        return {"status": "error", "message": message}, f"parameter importance failed: {message}"
    return {"status": "ok", **report.to_dict()}, format_table(report)


def importance_section(study: optuna.Study, **kwargs: Any) -> dict[str, Any]:
    """The ``importance`` entry of an export (see :func:`export_importance`); never raises."""
    return export_importance(study, **kwargs)[0]


# ---------------------------------------------------------------------------------------------
# terminal output


def _model_lines(m: ModelImportance, label: str, score_label: str, drop_label: str) -> list[str]:
    lines = [f"{label}: {m.message}"]
    if m.status != "ok":
        return lines
    lines[0] = f"{label}: {m.model}, cross-validated {score_label} {m.score_mean:.2f} ± {m.score_std:.2f}"
    lines[0] += f" ({m.n_trials} trials, {m.repeats} x {m.folds}-fold)"
    width = max(len(p.name) for p in m.params)
    show_fanova = any(p.fanova is not None for p in m.params)
    head = f"  {'#':>2}  {'parameter':<{width}}  {drop_label:>16}"
    lines.append(head + ("   fANOVA" if show_fanova else ""))
    for p in m.params:
        cell = "constant" if p.constant else f"{p.mean:+.3f} ± {p.std:.3f}"
        line = f"  {p.rank:>2}  {p.name:<{width}}  {cell:>16}"
        if show_fanova:
            line += f"   {p.fanova:.2f} (#{p.fanova_rank})" if p.fanova is not None else "   -"
        lines.append(line)
    for pair in m.pairs[:1]:
        a, b = pair.names
        lines.append(f"  permuted together, {a} and {b}: {drop_label} {pair.mean:+.3f} ± {pair.std:.3f}")
    lines += [f"  ! {w}" for w in m.warnings]
    return lines


def format_table(report: ImportanceReport) -> str:
    """The report as ranked tables for a terminal."""
    lines = [f"Parameter importance, study {report.study} (objective {report.objective})", ""]
    lines += _model_lines(report.objective_model, "What drives the objective", "R²", "R² drop")
    lines.append("")
    feas = report.feasibility_model
    lines += _model_lines(feas, "What makes configs infeasible", "ROC AUC", "AUC drop")
    if feas.classes:
        lines.append("  outcomes: " + ", ".join(f"{k} {v}" for k, v in feas.classes.items()))
    lines.append("")
    if report.fanova.status != "ok":
        lines.append(f"fANOVA cross-check: {report.fanova.message}")
    elif report.spearman_vs_fanova is not None:
        lines.append(
            f"fANOVA cross-check: rank correlation {report.spearman_vs_fanova:+.2f} with the surrogate"
        )
        if not report.disagreements:
            top = report.objective_model.top(1)
            lines.append(f"  no material disagreement; both rank {top[0]} first" if top else "")
    lines += [f"  disagrees on {d}" for d in report.disagreements]
    if report.notes:
        lines.append("")
        lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return value
