"""Is the winner real? Validation rounds in, speedups with 95 % bootstrap intervals and a verdict out.

Each round measures the baseline and every candidate in it once (a config that joined the top
later has rounds of its own); a candidate's speedup in a round is its value over that round's
baseline value, so drift between rounds cancels. Its speedup is the
median of those ratios, with a 95 % percentile bootstrap interval (``scipy.stats.bootstrap``).
A candidate counts as faster only when the interval's lower bound is above 1.0; the winner is
the fastest of those, and "keep vLLM's defaults" is the verdict when there is none.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna
    import optuna.trial

#: fewer rounds than this and no interval is computed (one ratio says nothing of the noise)
MIN_ROUNDS = 2
CONFIDENCE = 0.95
#: a search run and its rounds disagree when they differ by more than this many times the
#: baseline's round-to-round CV, and never by less than MIN_GAP
GAP_CVS = 3.0
MIN_GAP = 0.02


@dataclass(frozen=True)
class CandidateResult:
    """One validated config: its measurements and its speedup over the baseline."""

    trial: int
    values: tuple[float | None, ...]
    ratios: tuple[float, ...]
    median: float | None
    ci95: tuple[float, float] | None
    faster: bool
    config: dict[str, Any] = field(default_factory=dict)
    #: serve mode: the SLOs its validation rounds missed, ``{metric: median ms over the rounds}``;
    #: such a config never wins, however fast
    slo_misses: dict[str, float] = field(default_factory=dict)
    #: its one search run over the search's baseline run: what the study ranked it by
    search_ratio: float | None = None
    #: vLLM's compile cache (hit, miss, ...) in its search run, and in each of its rounds
    search_compile_cache: str | None = None
    round_compile_caches: tuple[str | None, ...] = ()
    #: its search run and the search's baseline run were measured on different devices
    search_other_device: bool = False


@dataclass(frozen=True)
class Verdict:
    """The validation of a study: every candidate's speedup, the noise, the winner in words.

    Attributes:
        rounds: Rounds in which the baseline was measured.
        baseline_values: The baseline's value in each round (None where it failed).
        noise_cv: The baseline's coefficient of variation over the rounds: this machine's and
            workload's noise.
        candidates: The validated configs, fastest median first.
        winner: The search trial whose config won, or None: keep vLLM's defaults.
        overlapping: Other faster candidates whose interval overlaps the winner's.
        verdict: The outcome in words.
        baseline_slo_misses: Serve mode: the SLOs vLLM's defaults missed in these rounds
            (``{metric: median ms}``); then "keep the defaults" cannot be followed.
        baseline_search_value: The baseline's value in the search (its one run there).
        mixed_rounds: ``(trial, round)`` pairs (rounds numbered from 1, as shown) whose ratio
            sets two devices' figures against each other: that config and vLLM's defaults were
            measured on different GPUs or machines in that round (rounds run in parallel on
            several GPUs, or one cut off and finished elsewhere).
        baseline_elsewhere: vLLM's defaults ran on another device in a round than in the search
            (a study resumed or validated on another machine): search ratios and rounds differ
            by that too.
    """

    rounds: int
    baseline_values: tuple[float | None, ...]
    noise_cv: float | None
    candidates: tuple[CandidateResult, ...]
    winner: int | None
    overlapping: tuple[int, ...]
    verdict: str
    baseline_slo_misses: dict[str, float] = field(default_factory=dict)
    baseline_search_value: float | None = None
    mixed_rounds: tuple[tuple[int, int], ...] = ()
    baseline_elsewhere: bool = False

    @property
    def winning(self) -> CandidateResult | None:
        return next((c for c in self.candidates if c.trial == self.winner), None)

    def to_dict(self) -> dict[str, Any]:
        """The ``validation`` entry of an export."""
        best = self.winning
        doc = asdict(self)
        # a latency no round reported is NaN here, null in JSON (which has no NaN)
        from autotune.study.slo import finite

        doc["baseline_slo_misses"] = finite(self.baseline_slo_misses)
        for c in doc["candidates"]:
            c["slo_misses"] = finite(c["slo_misses"])
        return {
            **doc,
            "speedup": best.median if best is not None else 1.0,
            "speedup_ci95": list(best.ci95) if best is not None and best.ci95 is not None else None,
            "keep_defaults": self.winner is None and not self.baseline_slo_misses,
        }


def _interval(ratios: Sequence[float], seed: int) -> tuple[float, float] | None:
    if len(ratios) < MIN_ROUNDS:
        return None
    if len(set(ratios)) == 1:  # every round agreed: the interval is that value
        return (ratios[0], ratios[0])
    import numpy as np
    from scipy.stats import bootstrap

    data = (np.asarray(ratios, dtype=float),)
    kw: dict[str, Any] = {"confidence_level": CONFIDENCE, "n_resamples": 9999, "method": "percentile"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns of degenerate resamples at 2-3 rounds
        try:
            res = bootstrap(data, np.median, rng=np.random.default_rng(seed), **kw)
        except TypeError:  # scipy before 1.15 names it random_state
            res = bootstrap(data, np.median, random_state=np.random.default_rng(seed), **kw)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def noise_pct(cv: float) -> str:
    """The baseline's round-to-round CV as a percentage, with a digit more below 0.1 % (a
    stable baseline reads 0.04 %, not 0.0 %)."""
    return f"{cv:.2%}" if cv < 0.00095 else f"{cv:.1%}"


def _cv(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


def judge(
    baseline: Sequence[float | None],
    candidates: Mapping[int, Sequence[float | None]],
    *,
    configs: Mapping[int, dict[str, Any]] | None = None,
    seed: int = 0,
    slo_misses: Mapping[int, dict[str, float]] | None = None,
    baseline_slo_misses: Mapping[str, float] | None = None,
) -> Verdict:
    """Judge validation rounds.

    Args:
        baseline: The baseline's value in each round (None where the measurement failed).
        candidates: Per search trial whose config was validated, its value in each round.
        configs: Each candidate's engine args, carried into the result.
        seed: Seeds the bootstrap.
        slo_misses: Per candidate, the SLOs its rounds missed (serve mode); such a candidate
            never wins.
        baseline_slo_misses: The SLOs the baseline's rounds missed (serve mode).

    Returns:
        The verdict; a candidate without :data:`MIN_ROUNDS` rounds next to a measured baseline
        gets no interval and never counts as faster.
    """
    results = []
    for trial, values in candidates.items():
        ratios = [v / b for v, b in zip(values, baseline, strict=False) if v is not None and b]
        ci = _interval(ratios, seed)
        results.append(
            CandidateResult(
                trial=trial,
                values=tuple(values),
                ratios=tuple(ratios),
                median=statistics.median(ratios) if ratios else None,
                ci95=ci,
                faster=ci is not None and ci[0] > 1.0,
                config=dict((configs or {}).get(trial, {})),
                slo_misses=dict((slo_misses or {}).get(trial, {})),
            )
        )
    results.sort(key=lambda c: -(c.median if c.median is not None else -math.inf))
    faster = [c for c in results if c.faster and not c.slo_misses]
    winner = faster[0] if faster else None
    overlapping = tuple(
        c.trial
        for c in faster[1:]
        if winner is not None
        and winner.ci95 is not None
        and c.ci95 is not None
        and c.ci95[1] >= winner.ci95[0]
    )
    measured = [b for b in baseline if b is not None]
    cv = _cv(measured)
    return Verdict(
        rounds=len(measured),
        baseline_values=tuple(baseline),
        noise_cv=cv,
        candidates=tuple(results),
        winner=winner.trial if winner is not None else None,
        overlapping=overlapping,
        verdict=_words(
            winner,
            overlapping,
            results,
            len(measured),
            cv,
            slos_judged=slo_misses is not None,
            baseline_misses=dict(baseline_slo_misses or {}),
        ),
        baseline_slo_misses=dict(baseline_slo_misses or {}),
    )


def _words(
    winner: CandidateResult | None,
    overlapping: tuple[int, ...],
    results: list[CandidateResult],
    rounds: int,
    cv: float | None,
    *,
    slos_judged: bool = False,
    baseline_misses: dict[str, float] | None = None,
) -> str:
    noise = f"; the baseline itself varied {noise_pct(cv)} between rounds" if cv is not None else ""
    if rounds < MIN_ROUNDS:
        return f"not enough rounds to judge ({rounds} with a measured baseline; {MIN_ROUNDS} needed)"
    if winner is None or winner.ci95 is None or winner.median is None:
        best = results[0] if results and results[0].median is not None else None
        closest = (
            f" (the closest, trial #{best.trial}: x{best.median:.3f}, 95 % CI "
            f"{best.ci95[0]:.3f}-{best.ci95[1]:.3f})"
            if best is not None and best.median is not None and best.ci95 is not None
            else ""
        )
        late = [c for c in results if c.faster and c.slo_misses]
        missed = (
            "; faster but missing an SLO in these rounds: "
            + ", ".join(f"#{c.trial} ({', '.join(c.slo_misses)})" for c in late)
            if late
            else ""
        )
        which = "no config that meets the SLOs" if slos_judged else "no config"
        if baseline_misses:
            return (
                f"{which} was faster than vLLM's defaults beyond the noise over {rounds} rounds"
                f"{closest}{noise}{missed}; but vLLM's defaults miss an SLO in these rounds "
                f"({_ms(baseline_misses)}): keeping them does not meet the SLOs"
            )
        return (
            f"keep vLLM's defaults: {which} was faster beyond the noise over {rounds} rounds"
            f"{closest}{noise}{missed}"
        )
    lo, hi = winner.ci95
    text = (
        f"trial #{winner.trial} is faster than vLLM's defaults: x{winner.median:.3f} "
        f"(95 % CI {lo:.3f}-{hi:.3f}) over {len(winner.ratios)} rounds{noise}"
    )
    late = [c for c in results if c.faster and c.slo_misses and (c.median or 0) > (winner.median or 0)]
    if late:
        text += "; faster but missing an SLO in these rounds: " + ", ".join(
            f"#{c.trial} ({', '.join(c.slo_misses)})" for c in late
        )
    if overlapping:
        others = ", ".join(f"#{n}" for n in overlapping)
        text += f"; no clear winner among the faster ones: {others} overlap(s) its interval"
    return text


def _ms(misses: Mapping[str, float]) -> str:
    return ", ".join(
        f"{k} {v:.1f} ms" if math.isfinite(v) else f"{k} not measured" for k, v in misses.items()
    )


def study_verdict(study: optuna.Study, *, seed: int = 0) -> Verdict | None:
    """The verdict of a study's validation rounds; None when it has none (not validated)."""
    from autotune.analysis.records import ANOTHER_DEVICE, DEVICE_SPREAD
    from autotune.study.objectives import primary_value
    from autotune.study.settings import raw_settings
    from autotune.study.trials import baseline_trial
    from autotune.study.validation import load_validation, measurements, rounds_of
    from autotune.trial.record import TrialRecord

    val = load_validation(study)
    base = baseline_trial(study)
    if val is None or base is None:
        return None
    found = [m for m in measurements(val) if m.finished]
    if not found:
        return None
    rounds = sorted({m.round for m in found if m.validates == base.number})
    candidates = sorted({m.validates for m in found} - {base.number})
    trials = study.get_trials(deepcopy=False)
    configs = {n: dict(TrialRecord.of(trials[n]).engine_kwargs or {}) for n in candidates}
    slos = raw_settings(study).get("slos") or {}
    verdict = judge(
        rounds_of(found, base.number, rounds),
        {n: rounds_of(found, n, rounds) for n in candidates},
        configs=configs,
        seed=seed,
        slo_misses={n: round_misses(val, [m for m in found if m.validates == n], slos) for n in candidates}
        if slos
        else None,
        baseline_slo_misses=round_misses(val, [m for m in found if m.validates == base.number], slos)
        if slos
        else None,
    )

    rounds_run = val.get_trials(deepcopy=False)

    def cache(trial: optuna.trial.FrozenTrial) -> str | None:
        return TrialRecord.of(trial).startup.get("compile_cache")

    base_value = primary_value(trials[base.number])
    search_base = TrialRecord.of(trials[base.number])
    searched = []
    for c in verdict.candidates:
        value = primary_value(trials[c.trial])
        by_round = {m.round: cache(rounds_run[m.number]) for m in found if m.validates == c.trial}
        searched.append(
            replace(
                c,
                search_ratio=value / base_value if value is not None and base_value else None,
                search_compile_cache=cache(trials[c.trial]),
                round_compile_caches=tuple(by_round.get(r) for r in rounds),  # aligned with values
                search_other_device=TrialRecord.of(trials[c.trial]).elsewhere_than(search_base),
            )
        )
    # a ratio of two measurements on different devices: both measured, both devices known
    measured = [m for m in found if m.value is not None]
    base_of = {m.round: TrialRecord.of(rounds_run[m.number]) for m in measured if m.validates == base.number}
    mixed = tuple(
        (m.validates, m.round + 1)
        for m in sorted(measured, key=lambda m: (m.validates, m.round))
        if m.validates != base.number
        and TrialRecord.of(rounds_run[m.number]).elsewhere_than(base_of.get(m.round))
    )
    text = verdict.verdict
    if mixed:
        text += (
            f"; {', '.join(f'#{n} in round {r}' for n, r in mixed)} {ANOTHER_DEVICE} in that round "
            f"({DEVICE_SPREAD})"
        )
    return replace(
        verdict,
        candidates=tuple(searched),
        baseline_search_value=base_value,
        mixed_rounds=mixed,
        baseline_elsewhere=any(b.elsewhere_than(search_base) for b in base_of.values()),
        verdict=text,
    )


def search_gaps(verdict: Mapping[str, Any]) -> list[str]:
    """Where a validated figure and the search's one run disagree beyond the rounds' noise, in
    words: the config's and the baseline's figures, and the compile cache or the device where it
    differed.

    Args:
        verdict: :meth:`Verdict.to_dict` (as an export or ``show --json`` holds it).
    """
    from autotune.analysis.records import ANOTHER_DEVICE, DEVICE_SPREAD

    cv = verdict.get("noise_cv")
    limit = max(MIN_GAP, GAP_CVS * cv) if isinstance(cv, (int, float)) else MIN_GAP
    out = []
    measured = [b for b in verdict.get("baseline_values") or () if b is not None]
    before = verdict.get("baseline_search_value")
    moved = False
    if measured and before:
        now = statistics.median(measured)
        if moved := abs(now / before - 1) > limit:
            out.append(
                f"vLLM's defaults: {before:,.1f} in the search's baseline run, {now:,.1f} here "
                f"(median, {now / before - 1:+.1%}): every search ratio is off by about that much"
                + (
                    " (the rounds ran on another GPU or machine than the search's baseline run)"
                    if verdict.get("baseline_elsewhere")
                    else ""
                )
            )
    for c in verdict.get("candidates") or ():
        was, now = c.get("search_ratio"), c.get("median")
        if not was or now is None or abs(now / was - 1) <= limit:
            continue
        values = [x for x in c.get("values") or () if x is not None]
        if moved and values and abs(statistics.median(values) / (was * before) - 1) <= limit:
            continue  # the config measured the same: the baseline moved (said above)
        text = f"#{c['trial']}: x{was:.3f} in its search run, x{now:.3f} validated ({now / was - 1:+.1%})"
        before_cache, rounds = (
            c.get("search_compile_cache"),
            [r for r in c.get("round_compile_caches") or () if r],
        )
        if before_cache and rounds and before_cache not in rounds:
            text += (
                f"; vLLM's compile cache: {before_cache} in the search run, "
                f"{'/'.join(sorted(set(rounds)))} in the rounds "
                "(a loaded compiled graph can run at another speed than a fresh compile)"
            )
        if c.get("search_other_device"):
            text += f"; its search run was {ANOTHER_DEVICE} in the search ({DEVICE_SPREAD})"
        out.append(text)
    return out


def round_misses(val: optuna.Study, found: Sequence[Any], slos: Mapping[str, float]) -> dict[str, float]:
    """The SLOs a config's validation rounds missed: each latency's median over the rounds that
    measured it, against its bound (a config no round measured misses none: it cannot win anyway)."""
    from autotune.study.slo import misses
    from autotune.trial.record import TrialRecord

    per_metric: dict[str, list[float]] = {}
    for m in found:
        metrics = TrialRecord.of(val.trials[m.number]).metrics
        for name in slos:
            if isinstance(metrics.get(name), (int, float)):
                per_metric.setdefault(name, []).append(float(metrics[name]))
    if not per_metric:
        return {}
    return misses({k: statistics.median(v) for k, v in per_metric.items()}, slos)
