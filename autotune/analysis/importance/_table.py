"""The feature table the surrogates learn from: one row per usable trial, parameters encoded
(log-scaled in log space, booleans as 0/1, numeric choices as ordinals, other categoricals
one-hot), missing values imputed, and which trials were left out and why."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from autotune.analysis.records import baseline_engine, resolved_value
from autotune.study.objectives import primary_value
from autotune.study.settings import raw_settings
from autotune.trial.record import INFEASIBLE, Role, TrialRecord

if TYPE_CHECKING:
    import optuna

FeatureKind = Literal["numeric", "bool", "ordinal", "onehot"]


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
        outcome: ``success``, ``oom``, ``invalid`` or ``quality`` for each row.
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
    """``oom`` or ``invalid`` when the trial shows the config cannot run, ``quality`` when its
    outputs drifted past the quality budget; None otherwise.

    A crash whose stored error reads as an OOM or an invalid config under today's patterns
    (:mod:`autotune.trial.outcome`) counts as that: studies recorded before a pattern existed keep
    their evidence. Trials the space's own constraints skipped never ran and return None.
    """
    import optuna

    from autotune.trial.outcome import classify

    if trial.state not in (optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL):
        return None
    record = TrialRecord.of(trial)
    if record.skipped:
        return None
    if record.outcome in INFEASIBLE:
        return record.outcome.value
    if record.outcome is None and trial.state == optuna.trial.TrialState.PRUNED and not record.error:
        return "invalid"  # pruned by hand or by an older tuner: the config was judged unusable
    if not record.error:
        return None
    event = {"event": "error", "error": record.error, "error_type": record.error_type or ""}
    timed_out = record.outcome is not None and record.outcome.value == "timeout"
    again, _, _, _ = classify(returncode=1, timed_out=timed_out, events=[event], stderr_tail="")
    return again.value if again in INFEASIBLE else None


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


def _usable(study: optuna.Study) -> tuple[list[tuple[optuna.trial.FrozenTrial, str]], list[str]]:
    """The trials a model can learn from, each with ``success``/``oom``/``invalid``/``quality``; and notes on
    what was left out."""
    import optuna

    rows: list[tuple[optuna.trial.FrozenTrial, str]] = []
    skipped: Counter[str] = Counter()
    for t in study.get_trials(deepcopy=False):
        record = TrialRecord.of(t)
        if record.duplicate_of is not None:
            skipped["duplicate"] += 1  # the same row as the trial it repeats
            continue
        if t.state == optuna.trial.TrialState.COMPLETE:
            value = primary_value(t)
            if value is not None and math.isfinite(value):
                rows.append((t, "success"))
            continue
        if t.state not in (optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL):
            continue
        kind = infeasible_kind(t)
        if kind is not None:
            if record.outcome not in INFEASIBLE and t.state.name == "FAIL":
                skipped[f"reread:{kind}"] += 1
            rows.append((t, kind))
        elif record.skipped:
            skipped["constraint"] += 1
        else:
            skipped[record.outcome.value if record.outcome else t.state.name.lower()] += 1
    notes = []
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
                f"{n} {what} trial(s) left out of the feasibility model (not an OOM, invalid or lossy config)"
            )
    return rows, notes


def _encode(
    features: tuple[Feature, ...], raw_rows: list[dict[str, Any]]
) -> tuple[np.ndarray, list[tuple[int, ...]], dict[str, int]]:
    """The encoded matrix, each feature's column indices, and how many values were imputed."""
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
    return np.array(columns, dtype=float).reshape(len(raw_rows), width), groups, imputed


def trial_table(study: optuna.Study) -> TrialTable:
    """The feature table of a study's usable trials (see the module docstring for which).

    Parameters are those any trial searched (a knob dropped from the space later still explains
    the trials that ran with it); a trial that did not search one ran it at its resolved value,
    or vLLM's default from the baseline's resolved config.
    """
    defaults = baseline_engine(study)
    rows, notes = _usable(study)
    dists: dict[str, list[Any]] = {}
    for t, _ in rows:
        for name, d in t.distributions.items():
            dists.setdefault(name, []).append(d)
    space_params = list((raw_settings(study).get("space") or {}).get("parameters") or {})
    names = [n for n in space_params if n in dists] + sorted(n for n in dists if n not in space_params)

    raw_rows: list[dict[str, Any]] = []
    kept: list[tuple[optuna.trial.FrozenTrial, str]] = []
    for t, kind in rows:
        values = {n: resolved_value(t, n, defaults) for n in names}
        # None recorded as a param is a choice (vLLM decides: quantization, attention backend)
        if TrialRecord.of(t).role is Role.BASELINE and any(
            v is None and n not in t.params for n, v in values.items()
        ):
            notes.append(f"baseline trial #{t.number} left out: its resolved config lacks some parameters")
            continue
        raw_rows.append(values)
        kept.append((t, kind))

    features = tuple(_feature_for(n, dists[n], [r[n] for r in raw_rows]) for n in names)
    X, groups, imputed = _encode(features, raw_rows)
    if imputed:
        notes.append(
            "no known value, imputed (median or most frequent): "
            + ", ".join(f"{k} in {v} trial(s)" for k, v in imputed.items())
        )
    value = np.array([primary_value(t) if kind == "success" else np.nan for t, kind in kept], dtype=float)
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
