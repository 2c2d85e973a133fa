"""The end of a run, for a person: what was found, against vLLM's defaults, and what to do next."""

from __future__ import annotations

from typing import Any

from autotune.output.text import fmt


def format_summary(summary: dict[str, Any], where: str = "") -> str:
    """``autotune run``'s closing lines for a :func:`autotune.study.trials.summary`.

    Args:
        where: The options that find the study again (``--studies-dir D`` / ``--storage URL``).
    """
    name = summary["study"]
    counts = ", ".join(f"{n} {state.lower()}" for state, n in summary["trials"].items() if n)
    lines = [f"study {name}: {sum(summary['trials'].values())} trials ({counts or 'none'})"]
    best = summary.get("best")
    objective = summary["objective"]
    base_value, base_trial = summary.get("baseline_value"), summary.get("baseline_trial")
    if best is None:
        lines.append("no trial completed: nothing to export yet")
    elif base_value is None:
        lines.append(
            f"best: trial #{best['trial']}, {fmt(best['value'])} {objective} (no baseline to compare with)"
        )
    elif best["trial"] == base_trial:
        lines.append(
            f"nothing beat vLLM's defaults: the best is the baseline itself (trial #{base_trial}, "
            f"{fmt(base_value)} {objective}); widen the space or run more trials"
        )
    else:
        lines.append(
            f"best: trial #{best['trial']}, {fmt(best['value'])} {objective}, "
            f"x{summary['speedup_over_baseline']:.3f} over vLLM's defaults "
            f"(trial #{base_trial}, {fmt(base_value)}; one measurement each)"
        )
        if summary.get("other_device"):
            from autotune.analysis.records import OTHER_DEVICE

            lines.append(f"  {OTHER_DEVICE}")
    front = summary.get("pareto_front")
    if front:
        lines.append(
            f"Pareto front ({', '.join(summary.get('objectives') or [])}): "
            + "; ".join(f"#{p['trial']} " + " / ".join(fmt(v) for v in p["values"]) for p in front)
            + "  (autotune export --trial N exports any point)"
        )
    validation = summary.get("validation") or {"status": "not validated"}
    if front:
        pass  # a front is not validated in rounds: said by the run
    elif validation.get("status") == "not validated":
        if best is not None and base_value is not None:
            lines.append(
                "not validated: `autotune validate` measures the best configs again in rounds beside "
                "vLLM's defaults"
            )
    else:
        lines.append(f"validated: {validation['verdict']}")
    quality = summary.get("quality")
    if quality and quality["status"] == "not checked" and quality["lossy"]:
        lines.append(
            f"quality NOT CHECKED: the recommended config changes the model's outputs "
            f"({', '.join(quality['lossy'])}); with real weights, run a study with the quality guard on"
        )
    elif quality and "kl_mean" in quality:
        lines.append(
            f"quality: its outputs drift {quality['kl_mean']:.4f} nats of mean KL per token from vLLM's "
            f"defaults' (top-1 agreement {quality['top1']:.1%}; budget {quality['budget']:g})"
        )
    at = f" --study {name}{where}"
    lines.append(
        f"next: autotune export{at} --out best.json  |  autotune report{at} --out report.html  |  "
        f"autotune show{at}"
    )
    return "\n".join(lines)
