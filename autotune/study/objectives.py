"""What a study optimises: one metric (maximised), or several for a Pareto front.

``--objectives throughput,ttft_p99`` makes a multi-objective study: each trial's values are those
metrics in that order, throughput metrics maximised and latencies (serve mode's, in ms) minimised;
Optuna's multi-objective TPE searches, and the study's answer is its Pareto front (the configs no
other beats on every objective), each front point exportable. Everything that needs one number
(the progress line, speedups, the best config when one is asked for) reads the first objective.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import optuna

from autotune.errors import StudyError
from autotune.study.settings import OBJECTIVES
from autotune.study.slo import METRICS as LATENCY_METRICS

#: short names users may give
ALIASES = {"throughput": "output_tokens_per_s", "tokens": "total_tokens_per_s", "requests": "requests_per_s"}
_EXAMPLE = "e.g. --objectives throughput,ttft_p99"


def canonical(name: str) -> str:
    """A metric's stored name: ``throughput`` is ``output_tokens_per_s``, ``ttft_p99`` is ``ttft_p99_ms``."""
    name = ALIASES.get(name.strip(), name.strip())
    if name not in OBJECTIVES and f"{name}_ms" in LATENCY_METRICS:
        name = f"{name}_ms"
    return name


Direction = Literal["minimize", "maximize"]


def direction(name: str) -> Direction:
    """``minimize`` for a latency, ``maximize`` for a throughput."""
    return "minimize" if name in LATENCY_METRICS else "maximize"


def parse_objectives(text: str, *, serve: bool) -> list[str]:
    """``"throughput,ttft_p99"`` as ``["output_tokens_per_s", "ttft_p99_ms"]``.

    Raises:
        StudyError: an unknown metric, a latency outside serve mode, fewer than two, a repeat.
    """
    names = [canonical(n) for n in text.split(",") if n.strip()]
    known = (*OBJECTIVES, *LATENCY_METRICS) if serve else OBJECTIVES
    for n in names:
        if n in LATENCY_METRICS and not serve:
            raise StudyError(f"--objectives: {n} is measured in serve mode only (add --mode serve)")
        if n not in known:
            raise StudyError(
                f"--objectives: unknown metric {n!r}; use throughput, {', '.join(OBJECTIVES)}"
                + (", or a latency such as ttft_p99, tpot_p99, e2el_p90" if serve else "")
                + f" ({_EXAMPLE})"
            )
    if len(names) < 2:
        raise StudyError(
            f"--objectives needs two or more metrics, comma-separated ({_EXAMPLE}); for one, --objective"
        )
    if len(set(names)) != len(names):
        raise StudyError(f"--objectives {text!r} names a metric twice")
    return names


def values_of(trial: optuna.trial.FrozenTrial) -> list[float] | None:
    return list(trial.values) if trial.values else None


def primary_value(trial: optuna.trial.FrozenTrial) -> float | None:
    """The trial's value of the study's first objective (its only one in a single-objective study)."""
    return float(trial.values[0]) if trial.values else None


def front(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The Pareto front of a multi-objective study (feasible trials only, as Optuna's
    ``best_trials``), in order of the first objective, best first; repeats left out."""
    from autotune.trial.record import TrialRecord

    points = [t for t in study.best_trials if TrialRecord.of(t).duplicate_of is None]
    sign = -1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else 1.0
    return sorted(points, key=lambda t: (sign * float(t.values[0]), t.number))


def describe(names: Sequence[str]) -> str:
    return ", ".join(f"{n} ({'lower' if direction(n) == 'minimize' else 'higher'} is better)" for n in names)
