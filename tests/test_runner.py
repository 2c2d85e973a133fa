"""The isolated trial process: a hung generate is killed at the timeout, with its whole group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.trial.outcome import Outcome
from autotune.trial.process import group_members
from autotune.trial.runner import TrialSpec, run_trial
from tests.helpers import worker_pid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _endless_spec(tmp_path: Path, tiny_model: Path, *, timeout_s: float) -> TrialSpec:
    """A real trial whose generate runs for minutes (~5 M output tokens), far past any test."""
    return TrialSpec(
        trial_dir=tmp_path / "trial",
        engine_kwargs={
            "model": str(tiny_model),
            "enforce_eager": True,
            "kv_cache_memory_bytes": 64 << 20,
            "max_model_len": 1024,
        },
        workload={
            "kind": "synthetic",
            "count": 5000,
            "input_len": 16,
            "output_len": 1000,
            "prefix_len": 0,
            "seed": 0,
            "path": None,
        },
        timeout_s=timeout_s,
    )


def test_timeout_kills_the_process_group(tmp_path: Path, tiny_model: Path):
    spec = _endless_spec(tmp_path, tiny_model, timeout_s=60)
    result = run_trial(spec)
    assert result.outcome is Outcome.TIMEOUT
    assert result.error_type == "timeout"
    assert "engine_start" in result.phases_s  # it got as far as the engine: a real hang, not a crash
    doc = json.loads((spec.trial_dir / "result.json").read_text())
    assert doc["outcome"] == "timeout"
    assert group_members(doc["pid"]) == []  # worker and engine-core children are all gone
    assert (spec.trial_dir / "stderr.log").stat().st_size > 0


def test_a_stop_request_ends_a_trial_waiting_in_another_thread(tmp_path: Path, tiny_model: Path):
    """Parallel trials wait in Optuna's threads, which Ctrl-C never reaches: request_stop()
    (called by the signal handler) must end them, their process groups included."""
    import threading
    import time

    from autotune.trial.process import request_stop, stop_requests

    spec = _endless_spec(tmp_path, tiny_model, timeout_s=600)
    raised: list[BaseException] = []

    def target() -> None:
        try:
            run_trial(spec)
        except BaseException as e:
            raised.append(e)

    stop_requests.reset()
    thread = threading.Thread(target=target)
    thread.start()
    log = spec.trial_dir / "stdout.log"
    deadline = time.monotonic() + 180
    while not (log.is_file() and '"phase": "generate"' in log.read_text(errors="replace")):
        assert time.monotonic() < deadline and thread.is_alive(), (
            f"the trial never reached generate: {raised}"
        )
        time.sleep(0.2)
    pgid = worker_pid(spec.trial_dir)
    asked = time.monotonic()
    try:
        request_stop()
        thread.join(timeout=30)
    finally:
        stop_requests.reset()
    assert not thread.is_alive() and isinstance(raised[0], KeyboardInterrupt)
    assert time.monotonic() - asked < 20  # SIGTERM, at most the grace period, then SIGKILL
    assert group_members(pgid) == []  # the worker and its engine-core children are gone
