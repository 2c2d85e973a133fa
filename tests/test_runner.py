"""The isolated trial process: a hung generate is killed at the timeout, with its whole group."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from autotune.trial.forkserver import WarmWorkers
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


@pytest.mark.parametrize("warm", [False, True], ids=["fresh", "forked"])
def test_timeout_kills_the_process_group(tmp_path: Path, tiny_model: Path, warm: bool):
    spec = _endless_spec(tmp_path, tiny_model, timeout_s=60)
    workers = WarmWorkers(tmp_path) if warm else None
    try:
        result = run_trial(spec, warm=workers)
    finally:
        if workers is not None:
            workers.close()
    assert result.outcome is Outcome.TIMEOUT
    assert result.error_type == "timeout"
    assert "engine_start" in result.phases_s  # it got as far as the engine: a real hang, not a crash
    doc = json.loads((spec.trial_dir / "result.json").read_text())
    assert doc["outcome"] == "timeout"
    assert doc["machine"]["host"] == socket.gethostname()  # where it ran, a failed trial included
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


def test_a_warm_worker_forks_each_trial_a_fresh_isolated_process(tmp_path: Path, tiny_model: Path):
    """Forked from one process that imported vLLM once: each trial is still a process of its own,
    in its own session and process group, measured the same way, and nothing outlives it."""
    import os

    workers = WarmWorkers(tmp_path)
    results = []
    try:
        for n, seqs in enumerate([8, 16]):
            spec = _endless_spec(tmp_path / str(n), tiny_model, timeout_s=300)
            spec = TrialSpec(
                **{**spec.__dict__, "workload": {**spec.workload, "count": 32, "output_len": 16}},
            )
            spec.engine_kwargs["max_num_seqs"] = seqs
            results.append(run_trial(spec, warm=workers))
        (server,) = workers._idle
        server_pid = server._proc.pid if server._proc is not None else None
    finally:
        workers.close()
    first, second = results
    assert first.outcome is second.outcome is Outcome.SUCCESS, (first.error, second.error)
    assert first.pid != second.pid and server_pid not in (first.pid, second.pid)
    assert first.metrics["output_tokens"] == second.metrics["output_tokens"] == 32 * 16
    # the second trial paid no import: its worker entered the engine start at once
    assert second.phases_s["engine_start"] - second.phases_s["import"] < 2.0
    assert group_members(first.pid) == group_members(second.pid) == []
    assert server_pid is not None and not os.path.exists(f"/proc/{server_pid}")  # ended with the run
    assert (tmp_path / "forkserver-1.log").is_file()


def test_a_warm_worker_dying_under_a_trial_is_not_the_configs_failure(tmp_path: Path, tiny_model: Path):
    """The fork server killed mid-trial: the trial (its whole group) ends, is recorded as
    interrupted (uncounted; its config runs again), and the run goes on without warm workers."""
    import os
    import signal
    import threading
    import time

    workers = WarmWorkers(tmp_path)
    spec = _endless_spec(tmp_path, tiny_model, timeout_s=300)
    results = []
    thread = threading.Thread(target=lambda: results.append(run_trial(spec, warm=workers)))
    thread.start()
    log = spec.trial_dir / "stdout.log"
    deadline = time.monotonic() + 180
    while not (log.is_file() and '"phase": "generate"' in log.read_text(errors="replace")):
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.2)
    pgid = worker_pid(spec.trial_dir)
    server = int(Path(f"/proc/{pgid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(server, signal.SIGKILL)
    thread.join(timeout=60)
    workers.close()
    assert not thread.is_alive()
    (result,) = results
    assert result.outcome is Outcome.INTERRUPTED and "warm worker" in (result.error or "")
    assert group_members(pgid) == []
    assert workers.broken is not None and workers.acquire({}) is None  # the rest: from scratch


def test_a_trial_its_pruner_stops_ends_with_its_partial_figure(tmp_path: Path, tiny_model: Path):
    """Progress comes from the real LLM.generate (its progress bar's hook); asked to stop, the
    trial's group is killed there and its record holds how far it got, never a measurement."""
    progress: list[tuple[float, float]] = []
    spec = _endless_spec(tmp_path, tiny_model, timeout_s=300)
    result = run_trial(
        spec,
        on_progress=lambda share, rate: progress.append((share, rate)),
        should_stop=lambda: bool(progress),
    )
    assert result.outcome is Outcome.STOPPED and result.error_type == "stopped"
    assert result.metrics["partial_share"] == progress[0][0] == 0.05
    assert result.metrics["partial_elapsed_s"] == progress[0][1] > 0  # (share, seconds so far)
    assert result.metrics["partial_output_tokens_per_s"] > 0
    assert "output_tokens_per_s" not in result.metrics
    assert group_members(result.pid or 0) == []
