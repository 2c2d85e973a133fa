"""The report's plots, drawn by matplotlib (Agg, no pyplot state) and embedded as base64 PNG."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autotune.analysis.records import TrialRow
from autotune.errors import ReportError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from autotune.analysis.importance import ImportanceReport, ModelImportance, TrialTable

#: How many of the most important parameters get a "objective vs parameter" panel.
TOP_PARAMS = 4
_INFEASIBLE_COLOR = "#d62728"
_FEASIBLE_COLOR = "#1f77b4"
_OTHER_COLOR = "#7f7f7f"
_BASELINE_COLOR = "#ff7f0e"


def _mt(text: Any) -> str:
    """Text for a matplotlib label: ``$`` would start mathtext (and can fail to parse)."""
    return str(text).replace("$", r"\$")


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportError("the HTML report needs matplotlib: pip install 'matplotlib>=3.7'") from None


def _figure(width: float, height: float) -> Figure:
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _png(fig: Figure, alt: str, caption: str = "") -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">{cap}</figure>'


def _strip(ax: Axes) -> None:
    """Room below the data for :func:`_bottom_marks`; call once, after plotting the data."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo - 0.1 * (hi - lo), hi)


def _bottom_marks(ax: Axes, xs: Sequence[float], color: str, label: str, marker: str = "x") -> None:
    """Markers along the bottom edge (see :func:`_strip`), for trials with no value to plot."""
    if not xs:
        return
    lo = ax.get_ylim()[0]
    ax.update_datalim([(x, lo) for x in xs], updatey=False)  # the x axis must reach them
    ax.autoscale_view(scaley=False)
    ax.scatter(
        list(xs),
        [0.03] * len(xs),
        transform=ax.get_xaxis_transform(),
        marker=marker,
        color=color,
        s=40,
        label=label,
        clip_on=False,
        zorder=3,
    )


def _legend_outside(ax: Axes, fontsize: int) -> None:
    """The legend right of the plot, where it covers no point."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize=fontsize, frameon=False)


def history_figure(rows: Sequence[TrialRow], objective: str, infeasible: dict[int, str]) -> str:
    """Objective per trial, the best so far, vLLM's defaults as a line; failures along the bottom."""
    from matplotlib.ticker import MaxNLocator

    fig = _figure(12, 4.4)
    ax = fig.add_subplot()
    done = [r for r in rows if r.value is not None]
    met: list[TrialRow] = []
    missed: list[TrialRow] = []
    for r in done:
        if r.role != "baseline":
            (missed if r.slo_misses else met).append(r)
    ax.scatter(
        [r.number for r in met],
        [float(r.value or 0.0) for r in met],
        color=_FEASIBLE_COLOR,
        s=30,
        label="trial",
        zorder=3,
    )
    if missed:  # measured, but never the best
        ax.scatter(
            [r.number for r in missed],
            [float(r.value or 0.0) for r in missed],
            color=_INFEASIBLE_COLOR,
            marker="x",
            s=36,
            label="misses an SLO",
            zorder=3,
        )
    best_x, best_y, best = [], [], -math.inf
    for r in done:
        assert r.value is not None
        if r.slo_misses:  # never the best: it misses an SLO
            continue
        best = max(best, r.value)
        best_x.append(r.number)
        best_y.append(best)
    base = next((r for r in done if r.role == "baseline"), None)
    if base is not None and base.value is not None:
        ax.axhline(
            base.value,
            color=_BASELINE_COLOR,
            ls="--",
            lw=1.5,
            label=f"vLLM defaults (#{base.number})",
            zorder=2,
        )
        ax.scatter([base.number], [base.value], color=_BASELINE_COLOR, marker="*", s=120, zorder=4)
    if best_x:
        last = max(r.number for r in rows)
        # on top of the defaults' line, which it covers when nothing beat the defaults: say so
        same = base is not None and best_y[-1] == base.value
        label = "best so far (= vLLM defaults: nothing beat them)" if same else "best so far"
        ax.step(
            [*best_x, last], [*best_y, best_y[-1]], where="post", color="#2ca02c", lw=2, label=label, zorder=3
        )
    _strip(ax)
    _bottom_marks(
        ax,
        [r.number for r in rows if r.number in infeasible],
        _INFEASIBLE_COLOR,
        "OOM / invalid / over quality budget (no value)",
    )
    _bottom_marks(
        ax,
        [r.number for r in rows if r.value is None and r.number not in infeasible and r.state != "RUNNING"],
        _OTHER_COLOR,
        "stopped early / crash / timeout / interrupted / skipped",
        marker="|",
    )
    ax.set_xlabel("trial")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(_mt(objective))
    ax.grid(alpha=0.3)
    _legend_outside(ax, fontsize=9)
    return _png(
        fig,
        "optimisation history",
        f"{objective} of every trial; the dashed line is vLLM's defaults"
        + ("; a cross missed an SLO (measured, never the best)" if missed else ""),
    )


#: the worker's phases, in order, and their colours in the time figure (only generate measures)
_PHASE_COLORS = {
    "start": "#bbbbbb",
    "import": "#8c564b",
    "validate": "#e377c2",
    "engine_start": "#ff7f0e",
    "warmup": "#bcbd22",
    "client_start": "#17becf",
    "generate": "#2ca02c",
    "probe": "#9467bd",
    "shutdown": "#7f7f7f",
}


def time_figure(rows: Sequence[TrialRow]) -> str | None:
    """Where each trial's seconds went, phase by phase, and the best so far over wall time."""
    timed = [r for r in rows if r.phase_s]
    if not timed:
        return None
    fig = _figure(12, 4.2)
    bars, curve = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    bottom = [0.0] * len(timed)
    for phase, color in _PHASE_COLORS.items():
        heights = [r.phase_s.get(phase, 0.0) for r in timed]
        if any(heights):
            bars.bar([r.number for r in timed], heights, bottom=bottom, color=color, label=phase, width=0.8)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    bars.set_xlabel("trial")
    bars.set_ylabel("seconds")
    bars.grid(alpha=0.3, axis="y")
    bars.legend(fontsize=8, ncol=3)
    xs, ys, best = [], [], -math.inf
    for r in sorted(
        (r for r in rows if r.value is not None and r.ended_min is not None), key=lambda r: r.ended_min or 0
    ):
        if r.slo_misses:
            continue
        best = max(best, float(r.value or 0.0))
        xs.append(float(r.ended_min or 0.0))
        ys.append(best)
    if xs:
        curve.step(xs, ys, where="post", color="#2ca02c", lw=2, marker="o", ms=4)
    curve.set_xlabel("minutes since the study's first trial started")
    curve.set_ylabel("best so far")
    curve.grid(alpha=0.3)
    return _png(
        fig,
        "where the time goes",
        "left: each trial's seconds by phase (only generate is measured; engine start holds "
        "torch.compile and CUDA-graph capture, much less when the study's compile cache has the "
        "config); right: the best value so far over the study's wall time, breaks between runs included",
    )


def _barh(ax: Axes, names: list[str], means: list[float], stds: list[float] | None, color: str) -> None:
    y = list(range(len(names)))[::-1]
    ax.barh(y, means, xerr=stds, color=color, alpha=0.85, capsize=3, error_kw={"lw": 1})
    ax.set_yticks(y, [_mt(n) for n in names])
    ax.axvline(0, color="#444", lw=0.8)
    ax.grid(axis="x", alpha=0.3)


def importance_figure(report: ImportanceReport) -> str | None:
    """Ranked importances with error bars: surrogate, fANOVA (same order), classifier."""
    panels: list[tuple[str, ModelImportance | None]] = []
    reg, cls = report.objective_model, report.feasibility_model
    if reg.status == "ok":
        panels.append(("objective", reg))
        if report.fanova.status == "ok":
            panels.append(("fanova", None))
    if cls.status == "ok":
        panels.append(("infeasible", cls))
    if not panels:
        return None
    n = max(len(reg.params), len(cls.params), 1)
    fig = _figure(4.6 * len(panels), 0.9 + 0.36 * n)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (kind, model) in zip(axes, panels, strict=True):
        if kind == "fanova":
            names = [p.name for p in reg.params if p.name in report.fanova.shares]
            _barh(ax, names, [report.fanova.shares[n] for n in names], None, "#2ca02c")
            ax.set_title("fANOVA (Optuna), same order", fontsize=11)
            ax.set_xlabel("share of the objective's variance")
            continue
        assert model is not None
        varying = [p for p in model.params if not p.constant]
        color = _FEASIBLE_COLOR if kind == "objective" else _INFEASIBLE_COLOR
        if not model.trustworthy:
            color = _OTHER_COLOR
        _barh(ax, [p.name for p in varying], [p.mean for p in varying], [p.std for p in varying], color)
        score = "R²" if model.score_name == "r2" else "ROC AUC"
        what = "Objective surrogate" if kind == "objective" else "Infeasibility classifier"
        title = f"{what}\nCV {score} {model.score_mean:.2f} ± {model.score_std:.2f}"
        ax.set_title(title + ("" if model.trustworthy else "  (not trustworthy)"), fontsize=11)
        ax.set_xlabel(f"drop in held-out {'AUC' if score == 'ROC AUC' else score}")
    return _png(
        fig,
        "parameter importances",
        "bars: mean drop in the held-out score when a parameter is permuted; whiskers: ±1 sd over "
        "repeats x permutations; grey bars: the model's own score is too low to trust",
    )


def _positions(feature: Any, values: list[Any]) -> tuple[list[float | None], list[str] | None]:
    """x positions of ``values`` of ``feature``; tick labels for categorical ones."""
    if feature.kind == "numeric":
        return [
            float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in values
        ], None
    choices = list(feature.choices)
    keys = [repr(c) for c in choices]
    out: list[float | None] = []
    for i, v in enumerate(values):
        k = repr(v)
        jitter = ((i * 7919) % 11 - 5) / 60.0  # deterministic, small
        out.append(keys.index(k) + jitter if k in keys else None)
    return out, [str(c).lower() if isinstance(c, bool) else str(c) for c in choices]


def scatter_figure(
    table: TrialTable, names: Sequence[str], objective: str, baseline_number: int | None = None
) -> str | None:
    """The objective against each of ``names``: feasible points, infeasible marks at the bottom."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    features = {f.name: f for f in table.features}
    names = [n for n in names if n in features][:TOP_PARAMS]
    if not names:
        return None
    cols = min(2, len(names))
    rows_n = math.ceil(len(names) / cols)
    fig = _figure(6.2 * cols, 3.8 * rows_n)
    axes = fig.subplots(rows_n, cols, squeeze=False).ravel()
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    base_rows = {i for i, n in enumerate(table.numbers) if n == baseline_number}
    for ax, name in zip(axes, names, strict=False):
        f = features[name]
        xs, ticks = _positions(f, [r.get(name) for r in table.raw])
        pairs = enumerate(zip(xs, table.value, strict=True))
        good = [(x, float(v), i) for i, (x, v) in pairs if x is not None and not math.isnan(v)]
        bad = [x for x, o in zip(xs, table.outcome, strict=True) if x is not None and o != "success"]
        ax.scatter(
            [g[0] for g in good if g[2] not in base_rows],
            [g[1] for g in good if g[2] not in base_rows],
            color=_FEASIBLE_COLOR,
            s=28,
            label="feasible",
            zorder=3,
        )
        for x, v, i in good:
            if i in base_rows:
                ax.scatter(
                    [x], [v], color=_BASELINE_COLOR, marker="*", s=140, label="vLLM defaults", zorder=4
                )
        if bad:
            _strip(ax)
        _bottom_marks(ax, bad, _INFEASIBLE_COLOR, "OOM / invalid / lossy")
        if f.kind == "numeric" and f.log:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        if ticks is not None:
            ax.set_xticks(range(len(ticks)), [_mt(t) for t in ticks])
            ax.set_xlim(-0.6, len(ticks) - 0.4)
        ax.set_xlabel(_mt(name) + ("  (log)" if f.log else ""))
        ax.set_ylabel(_mt(objective))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=3, frameon=False)
    return _png(
        fig,
        "objective against the top parameters",
        "feasible trials as points (the star is vLLM's defaults); configs that ran out of memory or "
        "were rejected have no value and sit as red crosses along the bottom",
    )


def gpu_figure(rows: Sequence[TrialRow]) -> str | None:
    """Mean GPU utilisation during generate, per trial; None when no trial recorded it."""
    from matplotlib.ticker import MaxNLocator

    have = [r for r in rows if r.gpu_util_pct is not None]
    if not have:
        return None
    fig = _figure(12, 3.4)
    ax = fig.add_subplot()
    colors = [_BASELINE_COLOR if r.role == "baseline" else _FEASIBLE_COLOR for r in have]
    ax.bar([r.number for r in have], [float(r.gpu_util_pct or 0.0) for r in have], color=colors)
    ax.set_ylim(0, 100)
    without = [r.number for r in rows if r.gpu_util_pct is None and r.state != "RUNNING"]
    if without:
        ax.set_ylim(-8, 100)
    _bottom_marks(ax, without, _OTHER_COLOR, "no telemetry (did not run to the end)")
    if without:
        _legend_outside(ax, fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("mean GPU utilisation (%)")
    ax.grid(axis="y", alpha=0.3)
    return _png(
        fig,
        "GPU utilisation per trial",
        "NVML utilisation averaged over each trial's generate phase (orange: vLLM's defaults)",
    )


def validation_figure(validation: dict[str, Any], objective: str) -> str | None:
    """Each validated config's value in each round beside vLLM's defaults' in the same round."""
    from matplotlib.ticker import MaxNLocator

    candidates = validation.get("candidates") or []
    base = validation.get("baseline_values") or []
    if not base:
        return None
    fig = _figure(12, 3.8)
    ax = fig.add_subplot()
    rounds = list(range(1, len(base) + 1))
    ax.plot(rounds, [b if b is not None else math.nan for b in base], color=_BASELINE_COLOR, marker="*",
            markersize=12, ls="--", label="vLLM defaults", zorder=4)  # fmt: skip
    # matplotlib's default colours without the defaults' orange
    colors = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
    for i, c in enumerate(candidates):
        values = [v if v is not None else math.nan for v in c.get("values") or []]
        winner = c["trial"] == validation.get("winner")
        ax.plot(rounds[: len(values)], values, marker="o", lw=2.5 if winner else 1.2, color=colors[i % 8],
                label=f"config of trial #{c['trial']}" + (" (the winner)" if winner else ""))  # fmt: skip
    ax.set_xlabel("validation round")
    ax.set_ylabel(_mt(objective))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    _legend_outside(ax, fontsize=9)
    return _png(
        fig,
        "validation rounds",
        "each config measured again in its rounds, in a shuffled order, beside vLLM's defaults; "
        "a speedup is a config's value over the defaults' in the same round",
    )


def tradeoff_figure(
    points: Sequence[tuple[int, float, float, bool]],
    x_name: str,
    y_name: str,
    *,
    front: Sequence[int] = (),
    bound: float | None = None,
    baseline: int | None = None,
) -> str | None:
    """Serve mode: each measured config's throughput (y) against a latency (x), the Pareto front
    or the feasible best joined, SLO misses crossed out, the SLO's bound as a line.

    Args:
        points: ``(trial, x, y, missed an SLO)`` of every measured trial.
        front: Trials on the front, in order of x.
        bound: The SLO's bound on ``x`` (a vertical line).
        baseline: The baseline trial (vLLM's defaults), marked.
    """
    if not points:
        return None
    fig = _figure(9, 4.6)
    ax = fig.add_subplot()
    ok = [p for p in points if not p[3]]
    miss = [p for p in points if p[3]]
    if ok:
        ax.scatter([p[1] for p in ok], [p[2] for p in ok], color=_FEASIBLE_COLOR, label="measured", zorder=3)
    if miss:
        ax.scatter([p[1] for p in miss], [p[2] for p in miss], color=_INFEASIBLE_COLOR, marker="x",
                   label="misses an SLO", zorder=3)  # fmt: skip
    by_trial = {p[0]: p for p in points}
    on_front = sorted((by_trial[n] for n in front if n in by_trial), key=lambda p: p[1])
    if on_front:
        ax.plot([p[1] for p in on_front], [p[2] for p in on_front], color=_FEASIBLE_COLOR, lw=1.5,
                marker="o", markersize=9, mfc="none", label="Pareto front", zorder=4)  # fmt: skip
    if baseline is not None and baseline in by_trial:
        b = by_trial[baseline]
        ax.scatter([b[1]], [b[2]], color=_BASELINE_COLOR, marker="*", s=220, label="vLLM defaults", zorder=5)
    for n, x, y, _ in points:
        ax.annotate(
            f"#{n}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8, color=_OTHER_COLOR
        )
    if bound is not None:
        ax.axvline(bound, color=_INFEASIBLE_COLOR, ls="--", lw=1, label=f"SLO: {_mt(x_name)} <= {bound:g}")
    ax.set_xlabel(_mt(x_name) + " (lower is better)")
    ax.set_ylabel(_mt(y_name) + " (higher is better)")
    ax.grid(alpha=0.3)
    _legend_outside(ax, fontsize=9)
    return _png(
        fig,
        f"{y_name} against {x_name}",
        "every measured config of the study; up and to the left is better; a config that misses an "
        "SLO never wins",
    )
