"""What a trial's quality probe says, in one place for ``show``, the report and the export: its
drift from the baseline's outputs, or why none was measured (a lossy config is always named)."""

from __future__ import annotations

from typing import Any

from autotune.space.lossy import lossy_changes
from autotune.trial.record import Outcome, Role, TrialRecord


def quality_of(record: TrialRecord, budget: float | None, fixed: dict[str, Any]) -> dict[str, Any]:
    """A trial's quality statement.

    Returns:
        ``status`` (``reference``: the baseline; ``within budget`` / ``over budget``: measured;
        ``not checked``: the study's guard is off; ``not measured``: it never got that far),
        ``lossy`` (its arguments that change outputs), ``budget``, and the measured ``kl_mean``,
        ``kl_max``, ``top1`` and ``positions`` when there are any, and ``probe_error`` when its
        probe failed.
    """
    lossy = lossy_changes(record.engine_kwargs or {}, fixed)
    keys = ("kl_mean", "kl_max", "top1", "positions")
    measured: dict[str, Any] = {k: record.quality[k] for k in keys if k in record.quality}
    if record.role is Role.BASELINE:
        status = "reference"
    elif measured:
        status = "over budget" if record.outcome is Outcome.QUALITY else "within budget"
    elif record.outcome is Outcome.QUALITY:
        status = "over budget"
    elif budget is None:
        status = "not checked"
    else:
        status = "not measured"
    out = {"status": status, "lossy": lossy, "budget": record.quality.get("budget", budget), **measured}
    if "probe_error" in record.quality:
        out["probe_error"] = record.quality["probe_error"]
    return out


def quality_text(q: dict[str, Any]) -> str:
    """One short line: ``KL 0.0031, top-1 98.2 %``, ``reference``, ``NOT CHECKED: kv_cache_dtype=fp8``."""
    if "kl_mean" in q:
        text = f"KL {q['kl_mean']:.4f}, top-1 {q['top1']:.1%}"
        return text + (" (over budget)" if q["status"] == "over budget" else "")
    if q["status"] == "not checked" and q["lossy"]:
        return "NOT CHECKED: " + ", ".join(q["lossy"]) + " changes outputs"
    if q["status"] == "over budget":
        return "lossy, not measured"
    return q["status"] if q["status"] == "reference" else ""
