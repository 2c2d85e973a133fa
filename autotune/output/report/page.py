"""The report page: header, headline, sections; no JavaScript, and a Content-Security-Policy that
forbids scripts and any outside resource. Written atomically."""

from __future__ import annotations

import datetime as _dt
import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune._logging import get_logger
from autotune.analysis.records import trial_rows
from autotune.atomic import write_text_atomic
from autotune.errors import ReportError
from autotune.output.report.figures import (
    TOP_PARAMS,
    gpu_figure,
    history_figure,
    require_matplotlib,
    scatter_figure,
)
from autotune.output.report.tables import best_vs_defaults_html, fmt_value, importance_html, kv, trials_html
from autotune.output.show import show_doc
from autotune.study.settings import is_autotune_study
from autotune.study.trials import baseline_trial

if TYPE_CHECKING:
    import optuna

    from autotune.analysis.importance import ImportanceReport

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

    best, base = doc["best"], doc["baseline"]
    header = [
        ("model", doc["model"]),
        ("workload", doc["workload"]),
        ("objective", f"{objective} ({doc['direction']})"),
        ("vLLM", f"{doc['vllm']} on {doc['platform']}"),
        ("GPUs", ", ".join(doc["gpus"]) or "none (CPU)"),
        ("fixed", ", ".join(f"{k}={fmt_value(v)}" for k, v in doc["fixed"].items()) or "—"),
        ("trials", ", ".join(f"{v} {k.lower()}" for k, v in doc["counts"].items() if v) or "none"),
        ("storage", storage or "—"),
    ]
    headline = "No trial has completed yet."
    if best is not None:
        headline = f"Best: trial #{best['trial']}, {fmt_value(best['value'])} {objective}"
        if best["speedup_over_baseline"] is not None and base is not None:
            headline += (
                f" — ×{best['speedup_over_baseline']:.3f} over vLLM's defaults ({fmt_value(base['value'])})"
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
        f"<p><b>{html.escape(headline)}</b></p>{kv(header)}{body}</body></html>\n"
    )


def write_report(study: optuna.Study, out: str | Path, **kwargs: Any) -> Path:
    """Render the report (see :func:`render_report`) and write it atomically to ``out``."""
    path = Path(out)
    text = render_report(study, **kwargs)
    write_text_atomic(path, text)
    _logger.info("report of study %r (%d KiB) -> %s", study.study_name, len(text) // 1024, path)
    return path
