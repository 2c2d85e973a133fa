"""``autotune show``: one study's settings, its best trial against the baseline, every trial."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from autotune.analysis.quality import quality_text
from autotune.analysis.records import OTHER_DEVICE, trial_rows
from autotune.analysis.verdict import noise_pct, search_gaps
from autotune.output.listing import summarize_study
from autotune.output.text import fmt, indent, table
from autotune.study.objectives import describe as describe_objectives
from autotune.study.objectives import front
from autotune.study.settings import raw_settings
from autotune.study.slo import describe as describe_slos
from autotune.study.slo import finite
from autotune.study.trials import baseline_trial
from autotune.trial.outcome import error_summary

if TYPE_CHECKING:
    import optuna


def _describe_param(name: str, spec: dict[str, Any]) -> str:
    from autotune.space.load import ParamSpec

    try:
        p = ParamSpec(
            name=name,
            type=spec.get("type", "categorical"),
            low=spec.get("low"),
            high=spec.get("high"),
            log=bool(spec.get("log", False)),
            step=spec.get("step"),
            choices=tuple(spec.get("choices") or ()),
        )
        return f"{name} {p.describe()}"
    except (TypeError, ValueError):
        return f"{name} {spec}"


def show_doc(study: optuna.Study, storage: str = "") -> dict[str, Any]:
    """One study as a JSON-able dict: settings, best vs baseline, trials."""
    from autotune.trial.workload import WorkloadSpec

    settings = raw_settings(study)
    summary = summarize_study(study, storage)
    rows = trial_rows(study)
    space = settings.get("space") or {}
    wl = settings.get("workload") or {}
    try:
        fields = {f.name for f in dataclasses.fields(WorkloadSpec)}
        workload = WorkloadSpec(**{k: v for k, v in wl.items() if k in fields}).describe()
    except (TypeError, ValueError):
        workload = str(wl)
    by_number = {r.number: r for r in rows}
    best = by_number.get(summary.best_trial) if summary.best_trial is not None else None
    base = baseline_trial(study)
    base_row = by_number.get(base.number) if base is not None else None
    comparison = []
    if best is not None:
        for n in best.params:
            comparison.append(
                {
                    "parameter": n,
                    "baseline": base_row.params.get(n) if base_row is not None else None,
                    "best": best.params.get(n),
                }
            )
    return {
        "study": study.study_name,
        "storage": storage,
        "autotune": summary.autotune,
        "model": settings.get("model"),
        "workload": workload,
        "objective": settings.get("objective"),
        "direction": study.direction.name.lower() if len(study.directions) == 1 else "multi",
        "vllm": summary.vllm,
        "platform": settings.get("platform"),
        "gpus": settings.get("gpus") or [],
        "fixed": space.get("fixed") or {},
        "searching": [_describe_param(n, s) for n, s in (space.get("parameters") or {}).items()],
        "constraints": space.get("constraints") or [],
        "counts": summary.counts,
        "budget": summary.budget,
        "budget_used": summary.used,
        "best": None
        if best is None
        else {
            "trial": best.number,
            "value": best.value,
            "speedup_over_baseline": best.speedup,
            "other_device": best.other_device,
        },
        "baseline": None if base_row is None else {"trial": base_row.number, "value": base_row.value},
        "best_vs_baseline": comparison,
        "quality_budget": settings.get("quality_budget"),
        "mode": settings.get("mode") or "offline",
        "load": settings.get("load") or {},
        "slos": settings.get("slos") or {},
        "objectives": settings.get("objectives") or [],
        "pareto_front": [{"trial": t.number, "values": list(t.values)} for t in front(study)]
        if len(study.directions) > 1
        else None,
        "validation": summary.validation,  # its rounds judged once, for ls and show alike
        # a figure the benchmark did not report is null (JSON has no NaN)
        "trials": [
            {
                **dataclasses.asdict(r),
                "slo_misses": finite(r.slo_misses),
            }
            for r in rows
        ],
    }


def _numbers(numbers: list[int]) -> str:
    """``#1, #4-#7``: trial numbers, runs of consecutive ones joined."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"#{r[0]}" if len(r) == 1 else f"#{r[0]}-#{r[-1]}" for r in runs)


def _validation_lines(v: dict[str, Any] | None) -> list[str]:
    if v is None:
        return [
            "Not validated: each speedup above is one measurement of each config; `autotune validate` "
            "measures the best again in rounds beside vLLM's defaults."
        ]
    cv = v.get("noise_cv")
    noise = f", vLLM's defaults varied {noise_pct(cv)} between rounds" if cv is not None else ""
    lines = [f"Validation: {v['rounds']} round(s) of vLLM's defaults{noise}", f"  verdict: {v['verdict']}"]
    rows = []
    for c in v["candidates"]:
        ci = c.get("ci95")
        rows.append(
            [
                f"#{c['trial']}" + (" *" if c["trial"] == v.get("winner") else ""),
                f"x{c['median']:.3f}" if c.get("median") is not None else "-",
                f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-",
                " ".join(f"{r:.3f}" for r in c.get("ratios") or ()) or "-",
                f"x{c['search_ratio']:.3f}" if c.get("search_ratio") else "-",
            ]
        )
    if rows:
        header = ["config of", "speedup", "95 % CI", "each round (x defaults)", "search run"]
        lines.append(indent(table(header, rows)))
    if gaps := search_gaps(v):
        lines.append("  the search's one run and the rounds disagree beyond the noise:")
        lines.extend(f"    {g}" for g in gaps)
    return lines


def _front_lines(doc: dict[str, Any]) -> list[str]:
    points = doc["pareto_front"]
    if not points:
        return ["Pareto front: no feasible completed trial yet."]
    rows = [[f"#{p['trial']}", *(fmt(v) for v in p["values"])] for p in points]
    return [
        f"Pareto front: {len(points)} config(s) no other beats on every objective "
        "(`autotune export --trial N` exports one)",
        indent(table(["trial", *doc["objectives"]], rows, set(range(len(doc["objectives"]) + 1)))),
    ]


def _serve_lines(doc: dict[str, Any]) -> list[str]:
    if doc.get("mode") != "serve":
        return []
    load = doc.get("load") or {}
    conc, rate = load.get("concurrency"), load.get("request_rate")
    text = (f"{conc} concurrent clients" if conc else "every request at once") + (
        f", {rate:g} requests/s" if rate else ""
    )
    return [f"  mode         serve: {text}", f"  SLOs         {describe_slos(doc.get('slos') or {})}"]


def _quality_line(budget: float | None) -> str:
    if budget is None:
        return (
            "Quality: NOT CHECKED (the study has no quality budget: --no-quality-check, dummy weights, "
            "or created before the guard): configs are ranked by speed alone; a lossy one (fp8 "
            "weights or KV cache) is named in the quality column."
        )
    return (
        f"Quality: each config's outputs compared with vLLM's defaults' on a probe of the workload's "
        f"prompts; over {budget:g} nats of mean KL per token is pruned (KL: mean KL divergence of "
        "the next-token distributions; top-1: share of positions with the same most likely token)."
    )


def _short(text: str | None, n: int = 90) -> str:
    if not text:
        return ""
    one = error_summary(str(text))
    return one if len(one) <= n else one[: n - 3] + "..."


def format_show(doc: dict[str, Any]) -> str:
    """``autotune show`` output for a :func:`show_doc` document."""
    gpus = doc["gpus"]
    gpu_text = f", {len(gpus)} x {gpus[0]}" if gpus else ""
    counts = ", ".join(f"{v} {k.lower()}" for k, v in doc["counts"].items() if v)
    lines = [
        f"Study {doc['study']}" + (f"  ({doc['storage']})" if doc["storage"] else ""),
        f"  model        {doc['model'] or '-'}",
        f"  workload     {doc['workload']}",
        f"  objective    {doc['objective'] or '-'} ({doc['direction']})"
        if not doc.get("objectives")
        else f"  objectives   {describe_objectives(doc['objectives'])}: a Pareto front",
        *_serve_lines(doc),
        f"  vLLM         {doc['vllm'] or '-'} on {doc['platform'] or '?'}{gpu_text}",
        f"  fixed        {', '.join(f'{k}={fmt(v)}' for k, v in doc['fixed'].items()) or '-'}",
        f"  searching    {(chr(10) + ' ' * 15).join(doc['searching']) or '-'}",
    ]
    if doc["constraints"]:
        lines.append(f"  constraints  {'; '.join(doc['constraints'])}")
    lines.append(f"  trials       {sum(doc['counts'].values())}: {counts or 'none'}")
    if doc["budget"] is not None:
        lines.append(
            f"  budget       {doc['budget']} trials, {doc['budget_used']} used (repeats, skips and "
            "cut-off trials use none); `autotune run --study S --trials N` sets it"
        )
    lines.append("")
    best, base = doc["best"], doc["baseline"]
    if best is None:
        lines.append("No completed trial yet.")
    else:
        line = f"Best: trial #{best['trial']}, {fmt(best['value'])} {doc['objective'] or ''}".rstrip()
        if base is not None and best["speedup_over_baseline"] is not None:
            speed = best["speedup_over_baseline"]
            line += f", x{speed:.3f} over vLLM's defaults (trial #{base['trial']}, {fmt(base['value'])})"
        elif base is None:
            line += " (no completed baseline to compare with)"
        lines.append(line)
        if base is not None and best.get("other_device"):
            lines.append(f"  ({OTHER_DEVICE})")
        if doc["best_vs_baseline"]:
            rows = [
                [
                    c["parameter"],
                    fmt(c["baseline"]),
                    fmt(c["best"]),
                    "" if c["baseline"] == c["best"] else "*",
                ]
                for c in doc["best_vs_baseline"]
            ]
            lines.append(indent(table(["parameter", "vLLM default", "best", "changed"], rows)))
    if doc.get("pareto_front") is not None:
        lines += ["", *_front_lines(doc)]
    lines += ["", _quality_line(doc.get("quality_budget"))]
    lines += ["", *_validation_lines(doc.get("validation"))]
    lines += ["", "Trials"]
    rows = []
    for r in doc["trials"]:
        note = _short(r["error"]) if r["error"] else ""
        if r.get("slo_misses"):
            missed = ", ".join(
                f"{k} {fmt(v)} ms > {fmt(doc['slos'].get(k))}" if v is not None else f"{k} not measured"
                for k, v in r["slo_misses"].items()
            )
            note = f"misses SLO: {missed}; {note}".rstrip("; ")
        if r.get("other_device"):
            note = f"[other device] {note}".strip()
        if r["role"] != "sampled":
            note = f"[{r['role']}] {note}".strip()
        rows.append(
            [
                str(r["number"]),
                r["state"],
                r["outcome"],
                fmt(r["value"]),
                f"x{r['speedup']:.3f}" if r["speedup"] is not None else "",
                f"{r['wall_s']:.0f}s" if isinstance(r["wall_s"], (int, float)) else "",
                quality_text(r["quality"]) if r.get("quality") else "",
                note,
            ]
        )
    lines.append(
        indent(
            table(["#", "state", "outcome", "value", "x base", "wall", "quality", "note"], rows, {0, 3, 4, 5})
        )
    )
    if others := [r["number"] for r in doc["trials"] if r.get("other_device")]:
        lines.append(f"[other device]: {_numbers(others)} {OTHER_DEVICE}")
    return "\n".join(lines)
