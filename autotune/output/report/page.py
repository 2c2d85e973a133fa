"""The report page: header, headline, sections; no JavaScript, and a Content-Security-Policy that
forbids scripts and any outside resource. Written atomically."""

from __future__ import annotations

import datetime as _dt
import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from autotune._logging import get_logger
from autotune.analysis.records import ANOTHER_DEVICE, TrialRow, trial_rows
from autotune.analysis.verdict import noise_pct, search_gaps
from autotune.atomic import write_text_atomic
from autotune.errors import ReportError
from autotune.output.report.figures import (
    TOP_PARAMS,
    gpu_figure,
    history_figure,
    require_matplotlib,
    scatter_figure,
    time_figure,
    tradeoff_figure,
    validation_figure,
)
from autotune.output.report.tables import best_vs_defaults_html, fmt_value, importance_html, kv, trials_html
from autotune.output.show import show_doc
from autotune.study.settings import is_autotune_study
from autotune.study.trials import baseline_trial
from autotune.trial.record import TrialRecord

if TYPE_CHECKING:
    from autotune.analysis.importance import ImportanceReport, TrialTable

_logger = get_logger(__name__)
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


def _headline(doc: dict[str, Any], objective: str) -> str:
    best, base = doc["best"], doc["baseline"]
    if best is None:
        return "No trial has completed yet."
    if doc.get("validation") is not None:
        return f"Validated: {doc['validation']['verdict']}."
    if base is not None and best["trial"] == base["trial"]:
        return (
            f"Nothing beat vLLM's defaults: the best is the baseline itself (trial #{base['trial']}, "
            f"{fmt_value(base['value'])} {objective})."
        )
    headline = f"Best: trial #{best['trial']}, {fmt_value(best['value'])} {objective}"
    if best["speedup_over_baseline"] is not None and base is not None:
        headline += (
            f" — ×{best['speedup_over_baseline']:.3f} over vLLM's defaults ({fmt_value(base['value'])}; "
            "one measurement each, not validated"
            + (f"; {ANOTHER_DEVICE})" if best.get("other_device") else ")")
        )
    return headline


def _header(doc: dict[str, Any], objective: str, storage: str) -> list[tuple[str, Any]]:
    return [
        ("model", doc["model"]),
        ("workload", doc["workload"]),
        ("objective", f"{objective} ({doc['direction']})"),
        ("vLLM", f"{doc['vllm']} on {doc['platform']}"),
        ("GPUs", ", ".join(doc["gpus"]) or "none (CPU)"),
        ("fixed", ", ".join(f"{k}={fmt_value(v)}" for k, v in doc["fixed"].items()) or "—"),
        ("trials", ", ".join(f"{v} {k.lower()}" for k, v in doc["counts"].items() if v) or "none"),
        ("storage", storage or "—"),
    ]


def _top_params(importance: ImportanceReport | None, table: TrialTable) -> list[str]:
    """Parameters for the scatter panels: the most important first, then the rest."""
    top: list[str] = []
    if importance is not None:
        reg, cls = importance.objective_model, importance.feasibility_model
        if reg.status == "ok":
            top = [p.name for p in reg.params if not p.constant][: TOP_PARAMS - 1]
        # what explains the red crosses belongs beside what explains the points
        top += [n for n in cls.top(1) if n not in top]
    return top + [f.name for f in table.features if f.name not in top]


def _gpu_section(rows: list[TrialRow], platform: str | None) -> str:
    gpu = gpu_figure(rows)
    if gpu is not None:
        return gpu
    why = (
        "this study ran on the CPU backend, where NVML has no GPU to sample."
        if platform == "cpu"
        else "no trial recorded metrics.telemetry.mean_gpu_util_pct (NVML unavailable?)."
    )
    return f'<p class="note">No GPU telemetry: {why}</p>'


def _validation_section(v: dict[str, Any] | None, objective: str) -> str:
    if v is None:
        return (
            '<p class="warn">Not validated: every speedup on this page is one measurement of each '
            "config. <code>autotune validate</code> measures the best configs again in rounds beside "
            "vLLM&#x27;s defaults.</p>"
        )
    rows = []
    for c in v["candidates"]:
        ci, median = c.get("ci95"), c.get("median")
        winner = " (winner)" if c["trial"] == v.get("winner") else ""
        each = " ".join(f"{r:.3f}" for r in c.get("ratios") or ())
        searched = f"x{c['search_ratio']:.3f}" if c.get("search_ratio") else "—"
        rows.append(
            f"<tr><td>#{c['trial']}{winner}</td>"
            f'<td class="num">{f"x{median:.3f}" if median is not None else "—"}</td>'
            f'<td class="num">{f"{ci[0]:.3f}–{ci[1]:.3f}" if ci else "—"}</td>'
            f"<td>{html.escape(each)}</td>"
            f'<td class="num">{searched}</td></tr>'
        )
    cv = v.get("noise_cv")
    noise = f" vLLM's defaults varied {noise_pct(cv)} between rounds." if cv is not None else ""
    table = (
        "<table><thead><tr><th>config of</th><th>speedup (median)</th><th>95 % CI</th>"
        "<th>each round (× defaults)</th><th>search run</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    gaps = search_gaps(v)
    notes = (
        '<p class="note">The search\'s one run and the rounds disagree beyond the noise:</p><ul>'
        + "".join(f"<li>{html.escape(g)}</li>" for g in gaps)
        + "</ul>"
        if gaps
        else ""
    )
    figure = validation_figure(v, objective) or ""
    return (
        f"<p><b>{html.escape(v['verdict'])}</b></p>"
        f"<p>{v['rounds']} round(s) of vLLM's defaults.{html.escape(noise)}</p>"
        f"{figure}{table}{notes}"
    )


def render_report(
    study: optuna.Study,
    *,
    storage: str = "",
    importance: ImportanceReport | None = None,
    importance_kwargs: dict[str, Any] | None = None,
    links_from: Path | None = None,
) -> str:
    """The HTML text of the study's report.

    Args:
        study: An autotune study.
        storage: The (redacted) storage URL, shown in the header.
        importance: A computed importance report; computed here when None.
        importance_kwargs: Passed to :func:`autotune.analysis.importance.compute_importance`.
        links_from: The directory the page will be in: trial logs are linked relative to it (so
            the page and the study's directory can move together); the working directory if None.

    Raises:
        ReportError: matplotlib is not installed, or the study is not an autotune study.
    """
    from autotune.analysis.importance import ImportanceError, compute_importance, trial_table

    if not is_autotune_study(study):
        raise ReportError(f"study {study.study_name!r} was not made by vllm-autotune (no settings stored)")
    require_matplotlib()  # fail early, and clearly
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
    base_trial = baseline_trial(study)
    scatter = scatter_figure(
        table,
        _top_params(importance, table),
        objective,
        base_trial.number if base_trial is not None else None,
    )
    sections = [
        ("history", "Optimisation history", history_figure(rows, objective, infeasible)),
        (
            "time",
            "Where the time goes",
            time_figure(rows) or '<p class="muted">No trial has recorded its phases yet.</p>',
        ),
        *_tradeoff_section(study, doc),
        (
            "validation",
            "Validation: is the winner real?",
            _validation_section(doc.get("validation"), objective),
        ),
        ("importance", "Parameter importance", importance_html(importance, error)),
        (
            "scatter",
            f"{objective} against the top parameters",
            scatter or '<p class="muted">No parameters.</p>',
        ),
        ("gpu", "GPU utilisation per trial", _gpu_section(rows, doc["platform"])),
        ("best", "Best config vs vLLM's defaults", best_vs_defaults_html(study, rows)),
        ("trials", "Trials", trials_html(rows, infeasible, links_from or Path.cwd())),
    ]
    body = "".join(
        f'<section id="{sid}"><h2>{html.escape(title)}</h2>{content}</section>'
        for sid, title, content in sections
    )
    title = f"autotune report: {study.study_name}"
    csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
    generated = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f'<p class="muted">Generated {html.escape(generated)} by vllm-autotune.</p>'
        f"<p><b>{html.escape(_headline(doc, objective))}</b></p>{kv(_header(doc, objective, storage))}"
        f"{body}</body></html>\n"
    )


def _tradeoff_section(study: optuna.Study, doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Serve mode: throughput against a latency, with the Pareto front (``--objectives``) or the
    first SLO's bound."""
    objectives, slos = doc.get("objectives") or [], doc.get("slos") or {}
    if len(objectives) > 1:
        y_name, x_name = objectives[0], objectives[1]
    elif slos:
        y_name, x_name = str(doc["objective"]), next(iter(slos))
    else:
        return []
    points = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        metrics = TrialRecord.of(t).metrics
        x, y = metrics.get(x_name), metrics.get(y_name)
        if (
            TrialRecord.of(t).duplicate_of is None
            and isinstance(x, (int, float))
            and isinstance(y, (int, float))
        ):
            points.append((t.number, float(x), float(y), any(v > 0 for v in t.constraints.values())))
    front_numbers = [p["trial"] for p in doc.get("pareto_front") or []]
    base = baseline_trial(study)
    figure = tradeoff_figure(
        points,
        x_name,
        y_name,
        front=front_numbers,
        bound=slos.get(x_name),
        baseline=base.number if base is not None else None,
    )
    title = "Pareto front" if len(objectives) > 1 else f"{y_name} against {x_name} (the SLO)"
    return [("tradeoff", title, figure or '<p class="muted">No measured trial yet.</p>')]


def write_report(study: optuna.Study, out: str | Path, **kwargs: Any) -> Path:
    """Render the report (see :func:`render_report`) and write it atomically to ``out``."""
    path = Path(out)
    text = render_report(study, links_from=path.resolve().parent, **kwargs)
    write_text_atomic(path, text)
    _logger.info("report of study %r (%d KiB) -> %s", study.study_name, len(text) // 1024, path)
    return path
