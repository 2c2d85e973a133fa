"""Serve mode's latency SLOs: what a study promises its users, and how a trial is judged by them.

An SLO is an upper bound on a latency statistic that vLLM's serving benchmark reports:
``ttft`` (time to first token), ``tpot`` (time per output token after the first), ``itl``
(inter-token latency), ``e2el`` (a request's end-to-end latency), each as ``mean``, ``p50``,
``p90`` or ``p99``, in milliseconds: ``--slo ttft_p99_ms=500,tpot_p99_ms=50``.

A measured trial gets one Optuna constraint per SLO, its measured value minus its bound
(:meth:`optuna.trial.Trial.set_constraint`: feasible at 0 or below). TPE learns the feasible
region from them, and Optuna's best trial is the best feasible one: a config that misses an SLO
is recorded with its latencies and never wins.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import optuna

from autotune.errors import ServeError

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATISTICS = ("mean", "p50", "p90", "p99")
#: every latency metric a serve trial reports, e.g. ``ttft_p99_ms``
METRICS = tuple(f"{lat}_{stat}_ms" for lat in LATENCIES for stat in STATISTICS)
_EXAMPLE = "e.g. --slo ttft_p99_ms=500,tpot_p99_ms=50"


def parse_slos(text: str) -> dict[str, float]:
    """``"ttft_p99_ms=500,tpot_p99_ms=50"`` as ``{"ttft_p99_ms": 500.0, "tpot_p99_ms": 50.0}``.

    Raises:
        ServeError: an unknown metric, a bound that is not a positive number, a metric twice.
    """
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq:
            raise ServeError(f"--slo {text!r}: {part!r} is not METRIC=MILLISECONDS ({_EXAMPLE})")
        if name not in METRICS:
            raise ServeError(
                f"--slo {text!r}: unknown metric {name!r}; use one of {', '.join(METRICS)} ({_EXAMPLE})"
            )
        try:
            bound = float(value)
        except ValueError:
            bound = float("nan")
        if not bound > 0 or bound == float("inf"):
            raise ServeError(
                f"--slo {text!r}: {name} must be a positive number of milliseconds, got {value!r}"
            )
        if name in out:
            raise ServeError(f"--slo {text!r}: {name} is given twice")
        out[name] = bound
    if not out:
        raise ServeError(f"--slo is empty; {_EXAMPLE}")
    return out


def describe(slos: Mapping[str, float]) -> str:
    return ", ".join(f"{k} <= {v:g}" for k, v in slos.items()) or "none"


def misses(metrics: Mapping[str, Any], slos: Mapping[str, float]) -> dict[str, float]:
    """The SLOs ``metrics`` miss: ``{metric: measured value}`` (a missing figure misses too)."""
    out = {}
    for name, bound in slos.items():
        value = metrics.get(name)
        if not isinstance(value, (int, float)) or value > bound:
            out[name] = float(value) if isinstance(value, (int, float)) else float("nan")
    return out


def finite(missed: Mapping[str, float]) -> dict[str, float | None]:
    """``missed`` (from :func:`misses`) for JSON, which has no NaN: a figure not reported is null."""
    return {k: v if math.isfinite(v) else None for k, v in missed.items()}


def set_constraints(trial: optuna.Trial, metrics: Mapping[str, Any], slos: Mapping[str, float]) -> None:
    """One constraint per SLO on a measured trial: its value minus its bound (ms), feasible at
    or below 0; a figure the benchmark did not report counts as the bound missed by itself."""
    for name, bound in slos.items():
        value = metrics.get(name)
        trial.set_constraint(name, float(value) - bound if isinstance(value, (int, float)) else bound)


def feasible(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether the trial meets every constraint it has (a trial without any does)."""
    return all(v <= 0 for v in trial.constraints.values())


def copy_constraints(trial: optuna.Trial, earlier: optuna.trial.FrozenTrial) -> None:
    """A repeat of a measured config answers with that trial's constraints as well as its value."""
    for name, value in earlier.constraints.items():
        trial.set_constraint(name, value)
