"""An importance report as ranked tables for a terminal."""

from __future__ import annotations

from autotune.analysis.importance._results import ImportanceReport, ModelImportance


def _model_lines(m: ModelImportance, label: str, score_label: str, drop_label: str) -> list[str]:
    lines = [f"{label}: {m.message}"]
    if m.status != "ok":
        return lines
    lines[0] = f"{label}: {m.model}, cross-validated {score_label} {m.score_mean:.2f} ± {m.score_std:.2f}"
    lines[0] += f" ({m.n_trials} trials, {m.repeats} x {m.folds}-fold)"
    width = max(len(p.name) for p in m.params)
    show_fanova = any(p.fanova is not None for p in m.params)
    head = f"  {'#':>2}  {'parameter':<{width}}  {drop_label:>16}"
    lines.append(head + ("   fANOVA" if show_fanova else ""))
    for p in m.params:
        cell = "constant" if p.constant else f"{p.mean:+.3f} ± {p.std:.3f}"
        line = f"  {p.rank:>2}  {p.name:<{width}}  {cell:>16}"
        if show_fanova:
            line += f"   {p.fanova:.2f} (#{p.fanova_rank})" if p.fanova is not None else "   -"
        lines.append(line)
    for pair in m.pairs[:1]:
        a, b = pair.names
        lines.append(f"  permuted together, {a} and {b}: {drop_label} {pair.mean:+.3f} ± {pair.std:.3f}")
    lines += [f"  ! {w}" for w in m.warnings]
    return lines


def format_table(report: ImportanceReport) -> str:
    """The report as ranked tables for a terminal."""
    lines = [f"Parameter importance, study {report.study} (objective {report.objective})", ""]
    lines += _model_lines(report.objective_model, "What drives the objective", "R²", "R² drop")
    lines.append("")
    feas = report.feasibility_model
    lines += _model_lines(
        feas,
        "What makes configs infeasible (OOM, invalid, over the quality budget)",
        "ROC AUC",
        "AUC drop",
    )
    if feas.classes:
        lines.append("  outcomes: " + ", ".join(f"{k} {v}" for k, v in feas.classes.items()))
    lines.append("")
    if report.fanova.status != "ok":
        lines.append(f"fANOVA cross-check: {report.fanova.message}")
    elif report.spearman_vs_fanova is not None:
        lines.append(
            f"fANOVA cross-check: rank correlation {report.spearman_vs_fanova:+.2f} with the surrogate"
        )
        if not report.disagreements:
            top = report.objective_model.top(1)
            lines.append(f"  no material disagreement; both rank {top[0]} first" if top else "")
    lines += [f"  disagrees on {d}" for d in report.disagreements]
    if report.notes:
        lines.append("")
        lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def headline(report: ImportanceReport) -> str:
    """The ranking in one line: the top parameters and whether the surrogate can be trusted."""
    m = report.objective_model
    if m.status != "ok":
        return f"parameter importance: {m.message}"
    top = ", ".join([p.name for p in m.params if not p.constant and p.mean > 0][:3]) or "none stands out"
    trust = "" if m.trustworthy else "; not trustworthy yet"
    return (
        f"parameter importance: {top} drive {report.objective} most (surrogate R² "
        f"{m.score_mean:.2f}{trust}); `autotune importance --study {report.study}` has the table"
    )
