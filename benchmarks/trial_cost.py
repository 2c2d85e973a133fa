"""What a trial costs, study against study: trials per hour, seconds per phase, best so far over
wall time, and, for the configs both studies ran, whether they measured the same.

``python -m benchmarks.trial_cost --study before=DB:NAME --study after=DB:NAME --out DIR`` writes
``DIR/trial_cost.json``, ``DIR/trial_cost.md`` and ``DIR/best_so_far.png``. Run the two studies
with the same seed and space (e.g. ``autotune run --cold-workers`` and ``autotune run``): the
sampler then proposes the same configs in the same order, so they compare trial by trial.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna

from autotune.atomic import write_json_atomic, write_text_atomic
from autotune.study.budget import budget_order, counted_trials
from autotune.study.objectives import primary_value
from autotune.study.slo import feasible
from autotune.study.trials import baseline_trial
from autotune.trial.record import TrialRecord
from autotune.trial.startup import read_startup

#: the worker's phases in order (see autotune.trial.protocol); each lasts until the next one
PHASES = ("import", "validate", "engine_start", "warmup", "client_start", "generate", "probe", "shutdown")
#: the budgets at which a study's best so far is reported (issue 17: after 10, 20 and 30 trials)
BEST_AFTER = (10, 20, 30)
#: the engine start's parts, as vLLM logged them (autotune.trial.startup)
STARTUP_PARTS = ("load_s", "weights_s", "compile_s", "cudagraph_s", "init_engine_s")


def startup_of(record: TrialRecord) -> dict[str, Any]:
    """A trial's engine-start parts: its record's, else read from its logs where they are here
    (a study from before the record held them)."""
    if record.startup or not record.trial_dir:
        return dict(record.startup)
    tdir = Path(record.trial_dir)
    return read_startup(tdir / "stdout.log", tdir / "stderr.log") if tdir.is_dir() else {}


def best_after(study: optuna.Study, budgets: tuple[int, ...] = BEST_AFTER) -> dict[str, dict[str, Any]]:
    """The study's best after its first N budget trials, for each N it has reached: the value,
    the trial and its ratio to the baseline's (one search run each, not validated; a trial that
    missed an SLO is no best, as in the study)."""
    order = budget_order(study)
    base = baseline_trial(study)
    base_value = primary_value(base) if base is not None else None
    out = {}
    for n in budgets:
        if len(order) < n:
            continue
        done = [(v, t) for t in order[:n] if (v := primary_value(t)) is not None and feasible(t)]
        if not done:
            continue
        value, best = max(done, key=lambda d: d[0])
        out[str(n)] = {
            "value": value,
            "trial": best.number,
            "vs_baseline": value / base_value if base_value else None,
        }
    return out


def study_cost(study: optuna.Study, skip_first: int = 0) -> dict[str, Any]:
    """One study's trial cost; ``skip_first`` trials (a fresh machine's cold start) left out of
    the rates, not of the best-so-far curve."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.datetime_start and t.datetime_complete]
    launched = [t for t in trials if TrialRecord.of(t).launched and TrialRecord.of(t).wall_s]
    clock = _busy_clock(trials)  # a resumed study's breaks between runs left out
    curve, best = [], None
    for t in sorted(trials, key=lambda t: t.datetime_complete):
        value = primary_value(t)  # a multi-objective study's first objective: its throughput
        if value is not None and feasible(t) and TrialRecord.of(t).duplicate_of is None:
            best = value if best is None else max(best, value)
        if best is not None:
            curve.append([clock(t.datetime_complete), best, t.number])
    rated = launched[skip_first:]
    span = _busy_span(rated)
    phases: dict[str, list[float]] = {}
    for t in rated:
        for phase, s in TrialRecord.of(t).phase_durations().items():
            phases.setdefault(phase, []).append(s)
    walls = [float(TrialRecord.of(t).wall_s or 0.0) for t in rated]
    startups = [startup_of(TrialRecord.of(t)) for t in rated]
    parts = {p: [float(s[p]) for s in startups if p in s] for p in STARTUP_PARTS}
    caches: dict[str, int] = {}
    for s in startups:
        if "compile_cache" in s:
            caches[s["compile_cache"]] = caches.get(s["compile_cache"], 0) + 1
    return {
        "study": study.study_name,
        "best_after": best_after(study),
        "trials": len(launched),
        "counted": counted_trials(study),
        "rated_trials": len(rated),
        "span_s": span,
        "trials_per_hour": len(rated) / span * 3600 if span else None,
        "median_wall_s": statistics.median(walls) if walls else None,
        "median_phase_s": {p: statistics.median(v) for p, v in phases.items()},
        "median_startup_s": {p: statistics.median(v) for p, v in parts.items() if v},
        "compile_cache": caches,
        "best_so_far": curve,
        "per_trial": [
            {
                "number": t.number,
                "value": primary_value(t),
                "state": t.state.name,
                "wall_s": TrialRecord.of(t).wall_s,
                "phase_s": TrialRecord.of(t).phase_durations(),
                "startup": startup_of(TrialRecord.of(t)),
                "engine_kwargs": TrialRecord.of(t).engine_kwargs,
            }
            for t in launched
        ],
    }


#: a gap between one trial's end and the next one's start longer than this is a break between
#: runs (a resumed study), not the tuner's own overhead
BREAK_S = 120.0


def _in_order(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    return sorted(trials, key=lambda t: (t.datetime_start, t.number))


def _breaks(trials: list[optuna.trial.FrozenTrial]) -> list[tuple[datetime, datetime]]:
    """The breaks between runs: from a trial's end (its start + wall) to the next one's start,
    where that gap is longer than the tuner's own overhead (:data:`BREAK_S`)."""
    ordered = _in_order(trials)
    out = []
    for t, following in itertools.pairwise(ordered):
        assert t.datetime_start is not None and following.datetime_start is not None
        wall = float(TrialRecord.of(t).wall_s or 0.0)
        if (following.datetime_start - t.datetime_start).total_seconds() > wall + BREAK_S:
            out.append((t.datetime_start + timedelta(seconds=wall), following.datetime_start))
    return out


def _busy_clock(trials: list[optuna.trial.FrozenTrial]) -> Callable[[datetime], float]:
    """Seconds of the tuner's busy time at a moment: since the first trial's start, the breaks
    between runs before it left out (a moment inside a break reads as the break's start)."""
    if not trials:
        return lambda _: 0.0
    t0 = min(t.datetime_start for t in trials if t.datetime_start is not None)
    breaks = _breaks(trials)

    def at(moment: datetime) -> float:
        seconds = (moment - t0).total_seconds()
        for begin, end in breaks:
            if moment > begin:
                seconds -= (min(moment, end) - begin).total_seconds()
        return seconds

    return at


def _busy_span(trials: list[optuna.trial.FrozenTrial]) -> float:
    """Seconds the tuner spent on ``trials``: from each one's start to the next one's (the
    sampler's and the bookkeeping's time included), a break between runs counted as nothing."""
    if not trials:
        return 0.0
    last = _in_order(trials)[-1]
    assert last.datetime_start is not None
    return _busy_clock(trials)(last.datetime_start) + float(TrialRecord.of(last).wall_s or 0.0)


def same_configs(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """The configs both studies measured: each one's value and wall time in both."""
    first = {_key(r["engine_kwargs"]): r for r in a["per_trial"] if r["value"] is not None}
    out = []
    for r in b["per_trial"]:
        other = first.get(_key(r["engine_kwargs"]))
        if other is None or r["value"] is None:
            continue
        out.append(
            {
                "trials": [other["number"], r["number"]],
                "values": [other["value"], r["value"]],
                "value_ratio": r["value"] / other["value"],
                "walls_s": [other["wall_s"], r["wall_s"]],
            }
        )
    return out


def _key(kwargs: dict[str, Any] | None) -> str:
    import json

    return json.dumps(kwargs or {}, sort_keys=True)


def render(doc: dict[str, Any]) -> str:
    names = list(doc["studies"])
    phases = ["start", *PHASES]
    rows = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]

    def line(label: str, cells: list[str]) -> None:
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    studies = [doc["studies"][n] for n in names]
    line("trials run (rated)", [f"{s['trials']} ({s['rated_trials']})" for s in studies])
    line("trials per hour", [f"{s['trials_per_hour']:.1f}" if s["trials_per_hour"] else "-" for s in studies])
    line(
        "median trial wall (s)", [f"{s['median_wall_s']:.1f}" if s["median_wall_s"] else "-" for s in studies]
    )
    for p in phases:
        if any(p in s["median_phase_s"] for s in studies):
            line(f"median {p} (s)", [f"{s['median_phase_s'].get(p, 0.0):.1f}" for s in studies])
    for p in STARTUP_PARTS:
        if any(p in s.get("median_startup_s", {}) for s in studies):
            cells = [s.get("median_startup_s", {}).get(p) for s in studies]
            line(f"engine start: median {p[:-2]} (s)", [f"{c:.1f}" if c is not None else "-" for c in cells])
    if any(s.get("compile_cache") for s in studies):
        line(
            "compile cache (trials)",
            [
                ", ".join(f"{k} {v}" for k, v in sorted(s.get("compile_cache", {}).items())) or "-"
                for s in studies
            ],
        )
    line(
        "best (tok/s) at end",
        [f"{s['best_so_far'][-1][1]:,.0f}" if s["best_so_far"] else "-" for s in studies],
    )
    for n in BEST_AFTER:
        cells = [s.get("best_after", {}).get(str(n)) for s in studies]
        if any(cells):
            line(
                f"best after {n} trials (one run, x baseline)",
                [
                    f"{c['value']:,.0f} (#{c['trial']}"
                    + (f", x{c['vs_baseline']:.3f}" if c.get("vs_baseline") else "")
                    + ")"
                    if c
                    else "not reached"
                    for c in cells
                ],
            )
    out = [f"# Trial cost: {' vs '.join(names)}", "", *rows, ""]
    if doc.get("same_configs"):
        ratios = [c["value_ratio"] for c in doc["same_configs"]]
        out += [
            f"Configs both measured: {len(ratios)}; {names[-1]}/{names[0]} throughput ratio median "
            f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}).",
            "",
            f"| trials | {names[0]} tok/s | {names[-1]} tok/s | ratio | {names[0]} wall | {names[-1]} wall |",
            "|---|---|---|---|---|---|",
        ]
        for c in doc["same_configs"]:
            out.append(
                f"| #{c['trials'][0]} / #{c['trials'][1]} | {c['values'][0]:,.0f} | {c['values'][1]:,.0f} | "
                f"{c['value_ratio']:.3f} | {c['walls_s'][0]:.0f} | {c['walls_s'][1]:.0f} |"
            )
        out.append("")
    out.append("![best so far over wall time](best_so_far.png)")
    return "\n".join(out) + "\n"


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, s in doc["studies"].items():
        if s["best_so_far"]:
            xs = [p[0] / 60 for p in s["best_so_far"]]
            ys = [p[1] for p in s["best_so_far"]]
            ax.step(
                xs, ys, where="post", marker="o", label=f"{name} ({s['trials_per_hour'] or 0:.0f} trials/h)"
            )
    ax.set_xlabel("minutes of the study's runs (breaks between runs left out)")
    ax.set_ylabel("best output tok/s so far")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", action="append", required=True, metavar="LABEL=DB:NAME")
    p.add_argument(
        "--skip-first", type=int, default=0, help="leave each study's first N trials out of the rates"
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    studies = {}
    for item in args.study:
        label, _, rest = item.partition("=")
        db, _, name = rest.rpartition(":")
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
        studies[label] = study_cost(study, args.skip_first)
    doc: dict[str, Any] = {"studies": studies, "skip_first": args.skip_first}
    names = list(studies)
    if len(names) >= 2:
        doc["same_configs"] = same_configs(studies[names[0]], studies[names[-1]])
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "trial_cost.json", doc)
    write_text_atomic(args.out / "trial_cost.md", render(doc))
    plot(doc, args.out / "best_so_far.png")
    print(render(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
