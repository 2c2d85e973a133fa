"""``autotune report``: one self-contained HTML file a person can open offline.

Plots are drawn by matplotlib (Agg, no pyplot state) and embedded as base64 PNG; there is no
JavaScript, and a Content-Security-Policy forbids scripts and any outside resource. Every piece of
text from the study (parameter names and values come from user YAML) goes through
``html.escape``. The file is written atomically.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune._logging import get_logger
from autotune.analysis.records import TrialRow, show_doc, trial_rows
from autotune.atomic import write_text_atomic
from autotune.errors import AutotuneError
from autotune.study.lifecycle import SETTINGS_ATTR, baseline_trial, best_trial

if TYPE_CHECKING:
    import optuna
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from autotune.analysis.importance import ImportanceReport, ModelImportance, TrialTable

_logger = get_logger(__name__)
#: How many of the most important parameters get a "objective vs parameter" panel.
TOP_PARAMS = 4
_INFEASIBLE_COLOR = "#d62728"
_FEASIBLE_COLOR = "#1f77b4"
_OTHER_COLOR = "#7f7f7f"
_BASELINE_COLOR = "#ff7f0e"
_METRICS = (
    ("output_tokens_per_s", "output tokens/s"),
    ("total_tokens_per_s", "total tokens/s"),
    ("requests_per_s", "requests/s"),
    ("generate_s", "generate (s)"),
    ("engine_start_s", "engine start (s)"),
    ("kv_cache_tokens", "KV cache tokens"),
)
_TELEMETRY = (
    ("mean_gpu_util_pct", "mean GPU util (%)"),
    ("peak_memory_bytes", "peak GPU memory (GiB)"),
    ("mean_power_w", "mean power (W)"),
)
_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1b1b1b;
 margin:0 auto;max-width:1240px;padding:24px}
h1{font-size:1.6em;margin:0 0 4px}h2{font-size:1.25em;margin:32px 0 8px;border-bottom:1px solid #ddd;
 padding-bottom:4px}h3{font-size:1.05em;margin:18px 0 6px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}
th,td{border:1px solid #d6d6d6;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.scroll{overflow-x:auto}.muted{color:#777}.bad{color:#b00020}.good{color:#0a7d28}
.changed td{background:#fff6dc !important}.warn{background:#fff3f3;border-left:4px solid #b00020;
 padding:6px 10px;margin:8px 0}.note{background:#f4f7ff;border-left:4px solid #4a6fd8;padding:6px 10px;
 margin:8px 0}figure{margin:10px 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:13px}dl.kv{display:grid;grid-template-columns:max-content auto;gap:2px 14px}
dl.kv dt{color:#555}dl.kv dd{margin:0}td.cfg{font-size:12px;min-width:420px}
tr.error td{color:#b00020;font-size:12px;background:#fff8f8 !important;border-top:0}
pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}
"""


class ReportError(AutotuneError):
    """The report cannot be built (matplotlib missing, an unusable study)."""


def _e(value: Any) -> str:
    """Escaped text of any value, for HTML content and attributes."""
    return html.escape(_fmt(value), quote=True)


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if abs(value) >= 100:
            return f"{value:,.1f}"
        return f"{value:.4g}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    return str(value)


def _grouped(value: Any) -> Any:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else value


def _mt(text: Any) -> str:
    """Text for a matplotlib label: ``$`` would start mathtext (and can fail to parse)."""
    return str(text).replace("$", r"\$")


# ---------------------------------------------------------------------------------------------
# figures


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportError("the HTML report needs matplotlib: pip install 'matplotlib>=3.7'") from None


def _figure(width: float, height: float) -> Figure:
    _require_matplotlib()
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


def history_figure(rows: Sequence[TrialRow], objective: str, infeasible: dict[int, str]) -> str:
    """Objective per trial, the best so far, vLLM's defaults as a line; failures along the bottom."""
    from matplotlib.ticker import MaxNLocator

    fig = _figure(10, 4.2)
    ax = fig.add_subplot()
    done = [r for r in rows if r.value is not None]
    ax.scatter(
        [r.number for r in done if r.role != "baseline"],
        [float(r.value or 0.0) for r in done if r.role != "baseline"],
        color=_FEASIBLE_COLOR,
        s=30,
        label="trial",
        zorder=3,
    )
    best_x, best_y, best = [], [], -math.inf
    for r in done:
        assert r.value is not None
        best = max(best, r.value)
        best_x.append(r.number)
        best_y.append(best)
    if best_x:
        last = max(r.number for r in rows)
        ax.step([*best_x, last], [*best_y, best_y[-1]], where="post", color="#2ca02c", label="best so far")
    base = next((r for r in done if r.role == "baseline"), None)
    if base is not None and base.value is not None:
        ax.axhline(
            base.value, color=_BASELINE_COLOR, ls="--", lw=1.5, label=f"vLLM defaults (#{base.number})"
        )
        ax.scatter([base.number], [base.value], color=_BASELINE_COLOR, marker="*", s=120, zorder=4)
    _strip(ax)
    _bottom_marks(
        ax,
        [r.number for r in rows if r.number in infeasible],
        _INFEASIBLE_COLOR,
        "OOM / invalid (no value)",
    )
    _bottom_marks(
        ax,
        [r.number for r in rows if r.value is None and r.number not in infeasible and r.state != "RUNNING"],
        _OTHER_COLOR,
        "crash / timeout / interrupted / skipped",
        marker="|",
    )
    ax.set_xlabel("trial")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(_mt(objective))
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    return _png(
        fig, "optimisation history", f"{objective} of every trial; the dashed line is vLLM's defaults"
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
    fig = _figure(5.2 * cols, 3.6 * rows_n)
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
        _bottom_marks(ax, bad, _INFEASIBLE_COLOR, "OOM / invalid")
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
        ax.legend(fontsize=8, loc="best")
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
    fig = _figure(10, 3.2)
    ax = fig.add_subplot()
    colors = [_BASELINE_COLOR if r.role == "baseline" else _FEASIBLE_COLOR for r in have]
    ax.bar([r.number for r in have], [float(r.gpu_util_pct or 0.0) for r in have], color=colors)
    ax.set_ylim(0, 100)
    without = [r.number for r in rows if r.gpu_util_pct is None and r.state != "RUNNING"]
    if without:
        ax.set_ylim(-8, 100)
    _bottom_marks(ax, without, _OTHER_COLOR, "no telemetry (did not run to the end)")
    if without:
        ax.legend(fontsize=8, loc="lower right")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("mean GPU utilisation (%)")
    ax.grid(axis="y", alpha=0.3)
    return _png(
        fig,
        "GPU utilisation per trial",
        "NVML utilisation averaged over each trial's generate phase (orange: vLLM's defaults)",
    )


# ---------------------------------------------------------------------------------------------
# tables


def _kv(pairs: Sequence[tuple[str, Any]]) -> str:
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{_e(v)}</dd>" for k, v in pairs)
    return f'<dl class="kv">{items}</dl>'


def _rows_html(headers: Sequence[str], body: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    rows = "".join(body)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'


def _td(value: Any, num: bool = False, cls: str = "") -> str:
    classes = " ".join(c for c in ("num" if num else "", cls) if c)
    attr = f' class="{classes}"' if classes else ""
    return f"<td{attr}>{_e(value)}</td>"


def _compare_rows(names: Sequence[str], left: dict[str, Any], right: dict[str, Any]) -> list[str]:
    out = []
    for n in names:
        a, b = left.get(n), right.get(n)
        changed = _fmt(a) != _fmt(b)
        tr = '<tr class="changed">' if changed else "<tr>"
        out.append(f"{tr}<td>{html.escape(n)}</td>{_td(a)}{_td(b)}</tr>")
    return out


def best_vs_defaults_html(study: optuna.Study, rows: Sequence[TrialRow]) -> str:
    """The best config beside vLLM's defaults: searched args, vLLM's resolved config, metrics."""
    base = baseline_trial(study)
    try:
        best = best_trial(study)
    except ValueError:
        return '<p class="muted">No trial completed yet.</p>'
    by_number = {r.number: r for r in rows}
    best_row, base_row = by_number[best.number], by_number.get(base.number) if base is not None else None
    parts = []
    if base is None or base_row is None:
        parts.append(
            '<p class="warn">The baseline (vLLM defaults) did not complete: nothing to compare with.</p>'
        )
    head = f"vLLM defaults (trial #{base.number})" if base is not None else "vLLM defaults"
    headers = ["", head, f"best (trial #{best.number})"]
    names = list(best_row.params)
    parts.append("<h3>Searched engine arguments</h3>")
    parts.append(
        _rows_html(headers, _compare_rows(names, base_row.params if base_row else {}, best_row.params))
    )
    base_engine = dict(base.user_attrs.get("engine") or {}) if base is not None else {}
    best_engine = dict(best.user_attrs.get("engine") or {})
    if base_engine or best_engine:
        keys = list(dict.fromkeys([*base_engine, *best_engine]))
        parts.append("<h3>As resolved by vLLM</h3>")
        parts.append(_rows_html(headers, _compare_rows(keys, base_engine, best_engine)))
    metrics_rows = []
    bm = dict(base.user_attrs.get("metrics") or {}) if base is not None else {}
    tm = dict(best.user_attrs.get("metrics") or {})
    for key, label in _METRICS:
        if key in bm or key in tm:
            if key == "kv_cache_tokens":
                a, b = bm.get(key), tm.get(key)
                metrics_rows.append(
                    f"<tr><td>{html.escape(label)}</td>{_td(_grouped(a), True)}{_td(_grouped(b), True)}</tr>"
                )
                continue
            metrics_rows.append(
                f"<tr><td>{html.escape(label)}</td>{_td(bm.get(key), True)}{_td(tm.get(key), True)}</tr>"
            )
    bt, tt = bm.get("telemetry") or {}, tm.get("telemetry") or {}
    for key, label in _TELEMETRY:
        a, b = bt.get(key), tt.get(key)
        if key == "peak_memory_bytes":
            a = a / 2**30 if isinstance(a, (int, float)) else a
            b = b / 2**30 if isinstance(b, (int, float)) else b
        if a is not None or b is not None:
            metrics_rows.append(f"<tr><td>{html.escape(label)}</td>{_td(a, True)}{_td(b, True)}</tr>")
    if metrics_rows:
        parts.append("<h3>Measured</h3>")
        parts.append(_rows_html(["metric", head, f"best (trial #{best.number})"], metrics_rows))
    kwargs = best.user_attrs.get("engine_kwargs") or {}
    if kwargs:
        parts.append("<h3>The best config as <code>LLM(**kwargs)</code></h3>")
        parts.append(f"<pre>{html.escape(json.dumps(kwargs, indent=2, default=str))}</pre>")
    return "".join(parts)


def _log_cell(row: TrialRow) -> str:
    if not row.log:
        return "<td></td>"
    uri = Path(row.log).as_uri()
    if row.log_exists:
        return f'<td><a href="{html.escape(uri)}">stderr.log</a></td>'
    return (
        f'<td><a class="muted" href="{html.escape(uri)}" '
        f'title="{html.escape(row.log)} is not on this machine">stderr.log</a> '
        '<span class="muted">(not here)</span></td>'
    )


def trials_html(rows: Sequence[TrialRow], infeasible: dict[int, str]) -> str:
    """Every trial: outcome, value, speedup, wall time, GPU util, config as run, log link; the
    error of a failed trial on a row of its own below it. Values that differ from vLLM's defaults
    (the baseline's resolved config) are in bold."""
    headers = ["#", "state", "outcome", "value", "× baseline", "wall (s)", "GPU util (%)", "config", "log"]
    defaults = next((r.params for r in rows if r.role == "baseline"), {})
    body = []
    for r in rows:
        outcome = r.outcome
        if r.number in infeasible and infeasible[r.number] != r.outcome:
            outcome = f"{r.outcome} (reads as {infeasible[r.number]})"
        cls = "good" if r.outcome == "success" else "bad" if r.number in infeasible else "muted"
        label = f"{r.number} (defaults)" if r.role == "baseline" else str(r.number)
        config = ", ".join(
            (
                f"<b>{_e(k)}={_e(v)}</b>"
                if r.role != "baseline" and _fmt(v) != _fmt(defaults.get(k))
                else f"{_e(k)}={_e(v)}"
            )
            for k, v in r.params.items()
        )
        cells = [
            _td(label),
            _td(r.state),
            _td(outcome, cls=cls),
            _td(r.value, True),
            _td(f"×{r.speedup:.3f}" if r.speedup is not None else None, True),
            _td(f"{r.wall_s:.0f}" if isinstance(r.wall_s, (int, float)) else None, True),
            _td(f"{r.gpu_util_pct:.0f}" if r.gpu_util_pct is not None else None, True),
            f'<td class="cfg">{config}</td>',
            _log_cell(r),
        ]
        body.append(f'<tr id="trial-{r.number}">' + "".join(cells) + "</tr>")
        if r.error:
            body.append(
                f'<tr class="error"><td></td><td colspan="{len(headers) - 1}">{_e(r.error)}</td></tr>'
            )
    return _rows_html(headers, body)


def _ranking_html(model: ModelImportance, drop: str, fanova: bool) -> str:
    if model.status != "ok":
        return f'<p class="note">{html.escape(model.message)}</p>'
    headers = ["#", "parameter", f"{drop} when permuted (mean ± sd)"] + (["fANOVA share"] if fanova else [])
    body = []
    for p in model.params:
        cell = "constant in these trials" if p.constant else f"{p.mean:+.3f} ± {p.std:.3f}"
        row = f"<tr>{_td(p.rank, True)}<td>{html.escape(p.name)}</td>{_td(cell, True)}"
        if fanova:
            row += _td(f"{p.fanova:.2f} (#{p.fanova_rank})" if p.fanova is not None else None, True)
        body.append(row + "</tr>")
    out = f"<p>{html.escape(model.message)}.</p>" + _rows_html(headers, body)
    alone = {p.name: p.mean for p in model.params}
    for pair in model.pairs[:1]:
        a, b = pair.names
        more = (
            f": more than either alone ({alone[a]:.3f}, {alone[b]:.3f})"
            if pair.mean > max(alone[a], alone[b])
            else ""
        )
        out += (
            f"<p>Permuted together, <b>{html.escape(a)}</b> and <b>{html.escape(b)}</b> cost "
            f"{pair.mean:.3f} ± {pair.std:.3f} of the held-out {html.escape(drop.split()[0])}{more}.</p>"
        )
    out += "".join(f'<p class="warn">{html.escape(w)}</p>' for w in model.warnings)
    return out


def importance_html(report: ImportanceReport | None, error: str | None) -> str:
    """The importance section: figure, rankings, fANOVA cross-check, notes."""
    if report is None:
        return f'<p class="warn">Parameter importance could not be computed: {html.escape(error or "")}</p>'
    parts = []
    fig = importance_figure(report)
    if fig:
        parts.append(fig)
    reg, cls = report.objective_model, report.feasibility_model
    parts.append("<h3>What drives the objective</h3>")
    parts.append(_ranking_html(reg, "R² drop", report.fanova.status == "ok"))
    parts.append("<h3>What makes configs infeasible (OOM or invalid)</h3>")
    if cls.classes:
        parts.append(
            '<p class="muted">Outcomes: '
            + html.escape(", ".join(f"{k} {v}" for k, v in cls.classes.items()))
            + "</p>"
        )
    parts.append(_ranking_html(cls, "AUC drop", False))
    parts.append("<h3>Cross-check against Optuna's fANOVA</h3>")
    if report.fanova.status != "ok":
        parts.append(f'<p class="note">{html.escape(report.fanova.message)}</p>')
    else:
        rho = report.spearman_vs_fanova
        parts.append(
            f"<p>{html.escape(report.fanova.message)}; rank correlation with the surrogate: "
            f"{_e(f'{rho:+.2f}' if rho is not None else None)}.</p>"
        )
        if report.disagreements:
            items = "".join(f"<li>{html.escape(d)}</li>" for d in report.disagreements)
            parts.append(f"<p>They disagree on:</p><ul>{items}</ul>")
        else:
            parts.append("<p>No material disagreement.</p>")
    if report.notes:
        parts.append("".join(f'<p class="muted">Note: {html.escape(n)}</p>' for n in report.notes))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# the page


def render_report(
    study: optuna.Study,
    *,
    storage: str = "",
    importance: ImportanceReport | None = None,
    importance_kwargs: dict[str, Any] | None = None,
) -> str:
    """The HTML text of the study's report.

    Args:
        study: An autotune study.
        storage: The (redacted) storage URL, shown in the header.
        importance: A computed importance report; computed here when None.
        importance_kwargs: Passed to :func:`autotune.analysis.importance.compute_importance`.

    Raises:
        ReportError: matplotlib is not installed, or the study is not an autotune study.
    """
    from autotune.analysis.importance import ImportanceError, compute_importance, trial_table

    if not isinstance(study.user_attrs.get(SETTINGS_ATTR), dict):
        raise ReportError(f"study {study.study_name!r} was not made by vllm-autotune (no settings stored)")
    _require_matplotlib()  # fail early, and clearly
    doc = show_doc(study, storage)
    rows = trial_rows(study)
    table = trial_table(study)
    infeasible = {n: o for n, o in zip(table.numbers, table.outcome, strict=True) if o != "success"}
    error = None
    if importance is None:
        try:
            importance = compute_importance(study, **(importance_kwargs or {}))
        except ImportanceError as e:
            error = str(e)
    objective = str(doc["objective"] or "objective")

    best, base = doc["best"], doc["baseline"]
    header = [
        ("model", doc["model"]),
        ("workload", doc["workload"]),
        ("objective", f"{objective} ({doc['direction']})"),
        ("vLLM", f"{doc['vllm']} on {doc['platform']}"),
        ("GPUs", ", ".join(doc["gpus"]) or "none (CPU)"),
        ("fixed", ", ".join(f"{k}={_fmt(v)}" for k, v in doc["fixed"].items()) or "—"),
        ("trials", ", ".join(f"{v} {k.lower()}" for k, v in doc["counts"].items() if v) or "none"),
        ("storage", storage or "—"),
    ]
    headline = "No trial has completed yet."
    if best is not None:
        headline = f"Best: trial #{best['trial']}, {_fmt(best['value'])} {objective}"
        if best["speedup_over_baseline"] is not None and base is not None:
            headline += (
                f" — ×{best['speedup_over_baseline']:.3f} over vLLM's defaults ({_fmt(base['value'])})"
            )

    top: list[str] = []
    if importance is not None:
        reg, cls = importance.objective_model, importance.feasibility_model
        if reg.status == "ok":
            top = [p.name for p in reg.params if not p.constant][: TOP_PARAMS - 1]
        # what explains the red crosses belongs beside what explains the points
        top += [n for n in cls.top(1) if n not in top]
    top += [f.name for f in table.features if f.name not in top]
    base_trial = baseline_trial(study)
    scatter = scatter_figure(table, top, objective, base_trial.number if base_trial is not None else None)
    gpu = gpu_figure(rows)
    if gpu is None:
        on_cpu = doc["platform"] == "cpu"
        gpu = (
            '<p class="note">No GPU telemetry: '
            + (
                "this study ran on the CPU backend, where NVML has no GPU to sample."
                if on_cpu
                else "no trial recorded metrics.telemetry.mean_gpu_util_pct (NVML unavailable?)."
            )
            + "</p>"
        )
    generated = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    sections = [
        ("history", "Optimisation history", history_figure(rows, objective, infeasible)),
        ("importance", "Parameter importance", importance_html(importance, error)),
        (
            "scatter",
            f"{objective} against the top parameters",
            scatter or '<p class="muted">No parameters.</p>',
        ),
        ("gpu", "GPU utilisation per trial", gpu),
        ("best", "Best config vs vLLM's defaults", best_vs_defaults_html(study, rows)),
        ("trials", "Trials", trials_html(rows, infeasible)),
    ]
    body = "".join(
        f'<section id="{sid}"><h2>{html.escape(title)}</h2>{content}</section>'
        for sid, title, content in sections
    )
    title = f"autotune report: {study.study_name}"
    csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f'<p class="muted">Generated {html.escape(generated)} by vllm-autotune.</p>'
        f"<p><b>{html.escape(headline)}</b></p>{_kv(header)}{body}</body></html>\n"
    )


def write_report(study: optuna.Study, out: str | Path, **kwargs: Any) -> Path:
    """Render the report (see :func:`render_report`) and write it atomically to ``out``."""
    path = Path(out)
    text = render_report(study, **kwargs)
    write_text_atomic(path, text)
    _logger.info("report of study %r (%d KiB) -> %s", study.study_name, len(text) // 1024, path)
    return path
