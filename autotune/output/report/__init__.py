"""``autotune report``: one self-contained HTML file a person can open offline.

Plots are drawn by matplotlib (Agg, no pyplot state) and embedded as base64 PNG; there is no
JavaScript, and a Content-Security-Policy forbids scripts and any outside resource. Every piece of
text from the study (parameter names and values come from user YAML) goes through
``html.escape``. The file is written atomically.
"""

from autotune.errors import ReportError
from autotune.output.report.figures import gpu_figure, history_figure, importance_figure, scatter_figure
from autotune.output.report.page import render_report, write_report

__all__ = [
    "ReportError",
    "gpu_figure",
    "history_figure",
    "importance_figure",
    "render_report",
    "scatter_figure",
    "write_report",
]
