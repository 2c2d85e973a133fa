"""Summarise a comparison's trials per config and render them as a Markdown report."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.atomic import write_json_atomic, write_text_atomic

#: per-trial numbers summarised (median over the config's successful runs)
_METRICS = ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "engine_start_s", "generate_s")
_TELEMETRY = ("mean_gpu_util_pct", "peak_memory_bytes", "mean_power_w")
_ROOFLINE = (
    "fraction",
    "floor_s",
    "compute_s",
    "memory_s",
    "ceiling_output_tokens_per_s",
    "ceiling_total_tokens_per_s",
)
_ENGINE = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "enable_prefix_caching",
    "kv_cache_tokens",
    "dtype",
    "cache_dtype",
    "max_model_len",
    "async_scheduling",
    "enforce_eager",
)
#: the configs every other is compared with, when present
BASELINES = ("defaults", "seed")


def _median(values: Sequence[float | None]) -> float | None:
    got = [float(v) for v in values if v is not None]
    return statistics.median(got) if got else None


def summarise(name: str, trials: list[dict[str, Any]]) -> dict[str, Any]:
    """One config's row: outcome, medians of its successful runs, the resolved engine facts."""
    ok = [t for t in trials if t["outcome"] == "success"]
    failed = [t for t in trials if t["outcome"] != "success"]
    row: dict[str, Any] = {"config": name, "runs": len(trials), "successes": len(ok)}
    if not trials:
        row["outcome"] = "not run"
    elif not failed:
        row["outcome"] = "success"
    else:
        first = failed[0]
        row["outcome"] = first["outcome"] if not ok else f"{len(ok)}/{len(trials)} success"
        row["error_type"] = first.get("error_type")
        row["error"] = first.get("error")
        row["log"] = first.get("stderr")
    for key in _METRICS:
        row[key] = _median([t["metrics"].get(key) for t in ok])
    for key in _TELEMETRY:
        row[key] = _median([(t.get("telemetry") or {}).get(key) for t in ok])
    out = [t["metrics"]["output_tokens_per_s"] for t in ok]
    row["output_tokens_per_s_range"] = [min(out), max(out)] if out else None
    row["roofline"] = {k: _median([(t.get("roofline") or {}).get(k) for t in ok]) for k in _ROOFLINE}
    first_roof = next((t["roofline"] for t in ok if t.get("roofline")), None)
    if first_roof:
        row["roofline"].update({k: first_roof[k] for k in ("bound", "batch", "decode_steps")})
    else:
        row["roofline"] = None
    with_engine = [t["engine"] for t in ok + failed if t.get("engine")]  # a success's facts first
    engine: dict[str, Any] = with_engine[0] if with_engine else {}
    row["engine"] = {k: engine.get(k) for k in _ENGINE if k in engine}
    return row


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``vs_defaults`` / ``vs_seed``: output tokens/s over that config's (the same work in every
    run, so total tokens/s and requests/s have the same ratios)."""
    by_name = {r["config"]: r for r in rows}
    for base in BASELINES:
        ref = by_name.get(base, {}).get("output_tokens_per_s")
        for r in rows:
            value = r.get("output_tokens_per_s")
            r[f"vs_{base}"] = value / ref if value is not None and ref else None


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _sig(value: Any, digits: int = 3) -> str:
    """``value`` to ``digits`` significant figures (floors span microseconds to minutes)."""
    return "–" if value is None else f"{float(value):.{digits}g}"


def _count(n: float) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3f} {unit}"
    return f"{n:.0f}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in body]
    return lines


def _throughput(r: dict[str, Any]) -> str:
    text = _num(r.get("output_tokens_per_s"))
    rng = r.get("output_tokens_per_s_range")
    if rng and r["successes"] > 1:
        text += f" ({_num(rng[0])}–{_num(rng[1])})"
    return text


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"×{value:.3f}"


def render(doc: dict[str, Any]) -> str:
    """The Markdown report of a comparison document (see :mod:`benchmarks.compare`)."""
    rows: list[dict[str, Any]] = doc["summary"]
    model = doc["model"]
    roof = doc.get("roofline") or {}
    lines = [
        f"# vLLM config comparison: {model['arch']}",
        "",
        f"- command: `{doc['command']}`",
        f"- date (UTC): {doc['started_at']} – {doc.get('finished_at') or 'unfinished'} ({doc['status']})",
        f"- device: {doc['device']}",
        f"- vLLM: {doc.get('vllm_version') or 'unknown'}",
        f"- model: {model['arch']} ({model['path']}), {_count(model['params'] or 0)} parameters, "
        f"{model['dtype']} checkpoint config",
        f"- workload: {doc['workload_description']}",
        f"- fixed for every config: `{json.dumps(doc['fixed'], sort_keys=True)}`",
        f"- sampling: `{json.dumps(doc['sampling'], sort_keys=True)}`, warm-up requests "
        f"{doc['warmup_requests']}, runs per config {doc['repeat']}",
    ]
    bench = roof.get("microbench")
    if bench:
        rates = ", ".join(f"{k} {v['flops_per_s'] / 1e12:.1f} TFLOP/s" for k, v in bench["matmul"].items())
        lines.append(
            f"- roofline rates ({bench['device']}): matmul {rates}; copy "
            f"{bench['copy']['bytes_per_s'] / 1e9:.0f} GB/s (read + write)"
        )
    elif roof.get("error"):
        lines.append(f"- roofline: unavailable ({roof['error']})")
    lines += [
        "",
        "## Throughput",
        "",
        "Medians over successful runs (range of output tok/s when more than one). Ratios are "
        "of output tok/s; the work is identical, so total tok/s and requests/s share them.",
        "",
    ]
    lines += _table(
        [
            "config",
            "outcome",
            "runs",
            "output tok/s",
            "total tok/s",
            "requests/s",
            "vs defaults",
            "vs seed",
            "engine start s",
            "generate s",
        ],
        [
            [
                r["config"],
                r["outcome"],
                f"{r['successes']}/{r['runs']}",
                _throughput(r),
                _num(r.get("total_tokens_per_s")),
                _num(r.get("requests_per_s"), 2),
                _ratio(r.get("vs_defaults")),
                _ratio(r.get("vs_seed")),
                _num(r.get("engine_start_s")),
                _sig(r.get("generate_s"), 4),
            ]
            for r in rows
        ],
    )
    lines += [
        "",
        "## Engine as resolved",
        "",
        "GPU util is NVML's mean over the generate phase; peak memory is the device's used memory "
        "(all processes) over the whole trial.",
        "",
    ]
    lines += _table(
        [
            "config",
            "GPU util %",
            "peak mem GiB",
            "KV cache tokens",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
            "prefix caching",
            "dtype / KV dtype",
        ],
        [
            [
                r["config"],
                _num(r.get("mean_gpu_util_pct")),
                _num(r["peak_memory_bytes"] / 2**30, 2) if r.get("peak_memory_bytes") else "–",
                _num(r["engine"].get("kv_cache_tokens")),
                _num(r["engine"].get("max_num_seqs")),
                _num(r["engine"].get("max_num_batched_tokens")),
                _num(r["engine"].get("block_size")),
                _num(r["engine"].get("enable_prefix_caching")),
                f"{r['engine'].get('dtype', '–')} / {r['engine'].get('cache_dtype', '–')}",
            ]
            for r in rows
        ],
    )
    lines += [
        "",
        "## Roofline",
        "",
        "floor = max(compute floor, memory floor); fraction = floor / measured generate s (1.0 is "
        "the hardware's limit); batch and decode steps as estimated from max_num_seqs and the KV "
        "cache (see benchmarks/roofline.py).",
        "",
    ]
    body = []
    for r in rows:
        f = r.get("roofline")
        if not f:
            body.append([r["config"], *(["–"] * 8)])
            continue
        body.append(
            [
                r["config"],
                f["bound"],
                _sig(f["compute_s"]),
                _sig(f["memory_s"]),
                _num(f["batch"]),
                _num(f["decode_steps"]),
                _sig(f["fraction"]),
                _num(f["ceiling_output_tokens_per_s"]),
                _num(f["ceiling_total_tokens_per_s"]),
            ]
        )
    lines += _table(
        [
            "config",
            "bound",
            "compute floor s",
            "memory floor s",
            "batch",
            "decode steps",
            "fraction",
            "ceiling output tok/s",
            "ceiling total tok/s",
        ],
        body,
    )
    failures = [r for r in rows if r["outcome"] != "success"]
    if failures:
        lines += ["", "## Failures", ""]
        lines += [
            f"- **{r['config']}**: not run (the run was interrupted before it)"
            if r["outcome"] == "not run"
            else f"- **{r['config']}**: {r['outcome']} ({r.get('error_type')}): {r.get('error')} "
            f"— log `{r.get('log')}`"
            for r in failures
        ]
    lines += ["", "## Configs", ""]
    for c in doc["configs"]:
        extra = f" (overridden by --set: {json.dumps(c['overridden'])})" if c.get("overridden") else ""
        lines.append(
            f"- **{c['name']}** from {c['source']}: `{json.dumps(c['params'], sort_keys=True)}`{extra}"
        )
    return "\n".join(lines) + "\n"


def write(doc: dict[str, Any], out: Path) -> None:
    """Summarise ``doc``'s trials per config (in ``doc["configs"]`` order) and write
    ``out/results.json`` and ``out/results.md``, each atomically."""
    rows = [
        summarise(c["name"], [t for t in doc["trials"] if t["config"] == c["name"]]) for c in doc["configs"]
    ]
    add_ratios(rows)
    doc["summary"] = rows
    versions = [t["engine"]["vllm_version"] for t in doc["trials"] if t["engine"].get("vllm_version")]
    if versions:
        doc["vllm_version"] = versions[0]
    write_json_atomic(out / "results.json", doc)
    write_text_atomic(out / "results.md", render(doc))
