"""The report's HTML tables and sections; every piece of study text goes through ``html.escape``."""

from __future__ import annotations

import html
import json
import math
import os
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.analysis.quality import quality_text
from autotune.analysis.records import TrialRow
from autotune.output.export import serve_command
from autotune.output.report.figures import importance_figure
from autotune.study.trials import baseline_trial, best_or_none
from autotune.trial.record import TrialRecord

if TYPE_CHECKING:
    import optuna

    from autotune.analysis.importance import ImportanceReport, ModelImportance

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


def _e(value: Any) -> str:
    """Escaped text of any value, for HTML content and attributes."""
    return html.escape(fmt_value(value), quote=True)


def fmt_value(value: Any) -> str:
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


def kv(pairs: Sequence[tuple[str, Any]]) -> str:
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
        changed = fmt_value(a) != fmt_value(b)
        tr = '<tr class="changed">' if changed else "<tr>"
        out.append(f"{tr}<td>{html.escape(n)}</td>{_td(a)}{_td(b)}</tr>")
    return out


def _metric_rows(base: TrialRecord | None, best: TrialRecord) -> list[str]:
    """Measured metrics and telemetry of the baseline and the best, one table row each."""
    bm, tm = (base.metrics if base is not None else {}), best.metrics
    rows = []
    for key, label in _METRICS:
        if key in bm or key in tm:
            a, b = bm.get(key), tm.get(key)
            if key == "kv_cache_tokens":
                a, b = _grouped(a), _grouped(b)
            rows.append(f"<tr><td>{html.escape(label)}</td>{_td(a, True)}{_td(b, True)}</tr>")
    bt, tt = (base.telemetry if base is not None else {}), best.telemetry
    for key, label in _TELEMETRY:
        a, b = bt.get(key), tt.get(key)
        if key == "peak_memory_bytes":
            a = a / 2**30 if isinstance(a, (int, float)) else a
            b = b / 2**30 if isinstance(b, (int, float)) else b
        if a is not None or b is not None:
            rows.append(f"<tr><td>{html.escape(label)}</td>{_td(a, True)}{_td(b, True)}</tr>")
    return rows


def best_vs_defaults_html(study: optuna.Study, rows: Sequence[TrialRow]) -> str:
    """The best config beside vLLM's defaults: searched args, vLLM's resolved config, metrics."""
    base = baseline_trial(study)
    best = best_or_none(study)
    if best is None:
        return '<p class="muted">No trial completed yet.</p>'
    by_number = {r.number: r for r in rows}
    best_row, base_row = by_number[best.number], by_number.get(base.number) if base is not None else None
    base_rec, best_rec = (TrialRecord.of(base) if base is not None else None), TrialRecord.of(best)
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
    base_engine = base_rec.engine if base_rec is not None else {}
    if base_engine or best_rec.engine:
        keys = list(dict.fromkeys([*base_engine, *best_rec.engine]))
        parts.append("<h3>As resolved by vLLM</h3>")
        parts.append(_rows_html(headers, _compare_rows(keys, base_engine, best_rec.engine)))
    metrics_rows = _metric_rows(base_rec, best_rec)
    if metrics_rows:
        parts.append("<h3>Measured</h3>")
        parts.append(_rows_html(["metric", head, f"best (trial #{best.number})"], metrics_rows))
    if best_rec.engine_kwargs:
        parts.append("<h3>The best config as <code>LLM(**kwargs)</code></h3>")
        parts.append(f"<pre>{html.escape(json.dumps(best_rec.engine_kwargs, indent=2, default=str))}</pre>")
        parts.append("<h3>The same as a <code>vllm serve</code> command</h3>")
        parts.append(f"<pre>{html.escape(serve_command(best_rec.engine_kwargs))}</pre>")
    return "".join(parts)


def _log_cell(row: TrialRow, links_from: Path) -> str:
    """A link to the trial's log, relative to the page: it works wherever the page and the
    study directory move together, and on another machine the link says where the log was."""
    if not row.log:
        return "<td></td>"
    href = urllib.parse.quote(os.path.relpath(row.log, links_from).replace(os.sep, "/"))
    if row.log_exists:
        return f'<td><a href="{html.escape(href)}" title="{html.escape(row.log)}">stderr.log</a></td>'
    return (
        f'<td><a class="muted" href="{html.escape(href)}" '
        f'title="{html.escape(row.log)} is not on this machine">stderr.log</a> '
        '<span class="muted">(not here)</span></td>'
    )


def trials_html(rows: Sequence[TrialRow], infeasible: dict[int, str], links_from: Path) -> str:
    """Every trial: outcome, value, speedup, wall time, GPU util, quality, config as run, log link; the
    error of a failed trial on a row of its own below it. Values that differ from vLLM's defaults
    (the baseline's resolved config) are in bold."""
    headers = ["#", "state", "outcome", "value", "× baseline", "wall (s)", "GPU util (%)", "quality"]
    headers += ["config", "log"]
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
                if r.role != "baseline" and fmt_value(v) != fmt_value(defaults.get(k))
                else f"{_e(k)}={_e(v)}"
            )
            for k, v in r.params.items()
        )
        cells = [
            _td(label),
            _td(r.state),
            _td(outcome, cls=cls),
            _td(r.value, True),
            _td(
                (f"×{r.speedup:.3f}" + (" (other device)" if r.other_device else ""))
                if r.speedup is not None
                else None,
                True,
            ),
            _td(f"{r.wall_s:.0f}" if isinstance(r.wall_s, (int, float)) else None, True),
            _td(f"{r.gpu_util_pct:.0f}" if r.gpu_util_pct is not None else None, True),
            _td(quality_text(r.quality) if r.quality else None),
            f'<td class="cfg">{config}</td>',
            _log_cell(r, links_from),
        ]
        body.append(f'<tr id="trial-{r.number}">' + "".join(cells) + "</tr>")
        if r.slo_misses:
            missed = ", ".join(
                f"{k} {v:,.1f} ms" if math.isfinite(v) else f"{k} not measured"
                for k, v in r.slo_misses.items()
            )
            body.append(
                f'<tr class="error"><td></td><td colspan="{len(headers) - 1}">'
                f"misses its SLO: {_e(missed)} (never the winner)</td></tr>"
            )
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
    parts.append("<h3>What makes configs infeasible (OOM, invalid, over the quality budget)</h3>")
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
