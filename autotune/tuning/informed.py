"""Informed start-up configs: what to measure right after the baseline, from what it measured.

A sampler's start-up trials are drawn blind, and on a 20-trial budget they are a third of it. The
baseline has already said how many of the workload's requests its KV cache holds at once: a
``max_num_seqs`` above that only queues (vLLM preempts), one far below leaves the GPU waiting
between steps, and on the H200 the best configs of every study sat near it. So once the baseline
has run, these are queued (behind the user's own ``--enqueue`` configs), each only with the
arguments the space searches or the installed vLLM has:

1. **kv-fit**: ``max_num_seqs`` = the baseline's KV cache tokens / tokens per request (prompt and
   output: what a request holds at its end), with asynchronous scheduling;
2. **kv-fit-fp8**: the same with the fp8 KV cache, which holds twice the tokens, and twice the
   batch (lossy: judged by the quality guard like any other);
3. **kv-fit-fp8-weights**: kv-fit-fp8 with online fp8 weights (``quantization=fp8``) as well,
   where the space offers them: fp8 GEMMs, and the memory the weights free goes to the KV cache,
   whose larger batch (predicted from the baseline's memory plan, :mod:`autotune.tuning.memory`)
   it runs (lossy, judged by the quality guard). On the H100 7B study this pair was the winner,
   x1.480 validated, found by TPE only at its 14th trial;
4. **throughput-mode**: vLLM's own ``performance_mode=throughput`` (twice its default batch and
   batched tokens).

Where a config's batch is larger than the baseline's largest CUDA graph (vLLM's default is
``min(2 * max_num_seqs, 512)`` on Hopper, capped by ``max_num_batched_tokens``) and the space
searches ``max_cudagraph_capture_size``, the config also raises it to the smallest size that
covers the batch: a decode step of more requests than the largest graph runs without CUDA graphs,
so a bigger batch would otherwise pay launch overhead on every step it gains. (The H200 study
of 2026-12-06 ran kv-fit-fp8 at 914 requests with graphs up to 512: x1.195, where an H100's 468
requests, covered, gave x1.298; how much of that gap the cover closes is for the next GPU run
to measure.)

**One wave.** Where a config's KV cache holds most of the workload but not all of it, the
requests left over run as a second, small batch at the end: on the H200, fp8 weights and KV held
961 of workload (a)'s 1,000 requests, and the last 39 decoded 256 steps nearly alone. Where the
space's ``gpu_memory_utilization`` reaches the memory for every request (by the memory plan, with
1 % to spare), the config takes the smallest such utilisation on the space's grid and
``max_num_seqs`` = the requests: the whole workload in one batch; not where that utilisation
leaves too little memory for its CUDA graphs (:meth:`MemoryPlan.max_utilization`; where the space
does not search ``max_cudagraph_capture_size``, vLLM's default for the larger batch may capture
larger graphs than the baseline's, which the bound does not scale for).

In serve mode at a fixed ``--concurrency`` no batch ever holds more requests than there are
clients, so the batches above are capped there, and kv-fit is left out where the defaults' own
``max_num_seqs`` already reaches it: it would measure the defaults again (the H100 serve study
of 2026-12-06 spent its second trial on kv-fit's 236 sequences at 128 clients, x0.988).

The sampler sees their params like any trial's; TPE's start-up then has measured points to
start from.
"""

from __future__ import annotations

import math
from collections.abc import Container
from typing import Any

from autotune.space.constraints import violations
from autotune.space.spec import ParamSpec, SearchSpace
from autotune.trial.record import TrialRecord
from autotune.tuning.memory import MemoryPlan

#: the KV-cache tokens a one-wave config keeps beyond the workload's need: the plan's error at
#: the baseline's batch shape (0.2 % on the H200) and the activations of another batch shape,
#: which the plan does not model
ONE_WAVE_SPARE = 0.01


def _fit(p: ParamSpec, value: Any) -> Any | None:
    """``value`` as parameter ``p`` can take it (an int clipped to its range), else None."""
    if p.type == "int" and p.low is not None and p.high is not None:
        return int(min(max(int(value), int(p.low)), int(p.high)))
    return value if p.records(value) else None


def _covering(p: ParamSpec, batch: int) -> Any | None:
    """The smallest value of ``p`` (a CUDA-graph size) that covers ``batch``, else its largest."""
    if p.type == "categorical":
        sizes = sorted(c for c in p.choices if isinstance(c, int) and not isinstance(c, bool))
        return next((c for c in sizes if c >= batch), sizes[-1] if sizes else None)
    return _fit(p, batch) if p.type == "int" else None


def _grid_at_least(p: ParamSpec, value: float) -> float | None:
    """The smallest value of float parameter ``p`` at or above ``value`` on its grid, which starts
    at its low end (0.01 apart without a step), and never below that end; None above its range."""
    assert p.low is not None and p.high is not None
    low, step = float(p.low), float(p.step or 0.01)
    # floating-point dust ignored: 0.95 / 0.01 is 95, not 95.00000000000001
    at = round(low + math.ceil(round((max(value, low) - low) / step, 6)) * step, 10)
    return at if at <= float(p.high) else None


def informed_configs(
    baseline: TrialRecord, space: SearchSpace, engine_args: Container[str]
) -> list[tuple[str, dict[str, Any]]]:
    """``(name, config)`` pairs to measure after ``baseline`` (see the module's docstring)."""
    params = {p.name: p for p in space.parameters}
    metrics = baseline.metrics
    kv_tokens = metrics.get("kv_cache_tokens")
    requests = metrics.get("num_requests") or 0
    per_request = (
        (metrics.get("prompt_tokens", 0) + metrics.get("output_tokens", 0)) / requests if requests else 0
    )

    def searched(config: dict[str, Any]) -> dict[str, Any] | None:
        out = {}
        for name, value in config.items():
            if name not in params:
                continue
            fitted = _fit(params[name], value)
            if fitted is None:
                return None
            out[name] = fitted
        return out or None

    graphs = baseline.engine.get("max_cudagraph_capture_size")
    capture = params.get("max_cudagraph_capture_size")

    def covered(config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with CUDA graphs up to its batch, where the baseline's stop short of it."""
        batch = config.get("max_num_seqs")
        if capture is None or not isinstance(graphs, int) or graphs <= 0 or not isinstance(batch, int):
            return config  # no CUDA graphs to cover with (eager), or not searched
        if batch <= graphs:
            return config
        size = _covering(capture, batch)
        return {**config, capture.name: size} if size is not None and size > graphs else config

    # serve mode at a fixed concurrency: no batch holds more requests than there are clients
    clients = metrics.get("concurrency")
    cap = clients if isinstance(clients, int) and clients > 0 else None

    def capped(seqs: int) -> int:
        return min(seqs, cap) if cap else seqs

    default_seqs = baseline.engine.get("max_num_seqs")
    plan = MemoryPlan.of(baseline)
    memory = params.get("gpu_memory_utilization")

    # a served workload's requests arrive over time (the serve worker records its load)
    served = "concurrency" in metrics or "request_rate" in metrics

    def one_wave(config: dict[str, Any], **precision: bool) -> dict[str, Any]:
        """``config`` with the utilisation that holds every request at once, where the space's
        reaches it and its batch falls short of the workload (offline only)."""
        if plan is None or memory is None or served or memory.low is None or memory.high is None:
            return config
        if not isinstance(config.get("max_num_seqs"), int) or config["max_num_seqs"] >= requests:
            return config
        need = plan.utilization_for(int(requests * per_request * (1 + ONE_WAVE_SPARE)), **precision)
        utilization = _grid_at_least(memory, max(need, plan.utilization))
        if utilization is None:
            return config
        wave = searched({**config, "max_num_seqs": requests, memory.name: utilization})
        if not wave or wave.get("max_num_seqs") != requests:
            return config
        wave = covered(wave)
        largest = wave.get(capture.name) if capture is not None else None
        if utilization > plan.max_utilization(largest if isinstance(largest, int) else None):
            return config  # what the engine holds beyond that share would not fit beside it
        return config if violations({**space.fixed, **wave}, space.constraints) else wave

    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(kv_tokens, (int, float)) and kv_tokens > 0 and per_request > 0:
        batch = max(1, int(kv_tokens // per_request))
        fit = searched({"max_num_seqs": capped(batch), "async_scheduling": True})
        if fit and "max_num_seqs" in fit:
            fit = one_wave(covered(fit))
            # at the cap with the defaults' batch reaching it and the rest as the defaults have
            # it, kv-fit would measure the defaults again
            again = (
                cap is not None
                and fit["max_num_seqs"] == cap
                and isinstance(default_seqs, int)
                and default_seqs >= cap
                and all(baseline.engine.get(k) == v for k, v in fit.items() if k != "max_num_seqs")
            )
            if not again:
                out.append(("kv-fit", fit))
        fp8 = searched({"kv_cache_dtype": "fp8", "max_num_seqs": capped(2 * batch), "async_scheduling": True})
        if fp8 and "kv_cache_dtype" in fp8:
            out.append(("kv-fit-fp8", one_wave(covered(fp8), fp8_kv=True)))
            # fp8 weights free memory for more of the KV cache: a larger batch, where the
            # baseline's memory plan says how much larger
            held = plan.kv_tokens_at(fp8_kv=True, fp8_weights=True) if plan else 2 * int(kv_tokens)
            weights = searched(
                {**fp8, "quantization": "fp8", "max_num_seqs": capped(max(1, int(held // per_request)))}
            )
            if weights and weights.get("quantization") == "fp8":
                weights = one_wave(covered(weights), fp8_kv=True, fp8_weights=True)
                out.append(("kv-fit-fp8-weights", weights))
    if "performance_mode" in engine_args and "performance_mode" not in space.fixed:
        out.append(("throughput-mode", {"performance_mode": "throughput"}))
    seen: list[dict[str, Any]] = []
    unique = []
    for name, config in out:
        if config not in seen:
            seen.append(config)
            unique.append((name, config))
    return unique
