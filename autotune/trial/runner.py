"""Run one trial in isolation: a worker subprocess in its own session, a timeout, a group kill.

Each trial gets a directory ``<study dir>/trials/<n>/`` holding ``spec.json`` (what was run),
``stdout.log`` and ``stderr.log`` (everything vLLM printed) and ``result.json`` (the outcome,
written atomically once the process is gone). A failure is data: it lands in ``result.json``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.trial import protocol
from autotune._logging import get_logger
from autotune.atomic import write_json_atomic
from autotune.trial.outcome import Outcome, TrialResult, classify
from autotune.trial.telemetry import GpuSampler, wait_for_idle_gpus

_logger = get_logger(__name__)
_TAIL_BYTES = 64 * 1024
_KILL_GRACE_S = 10.0
_POLL_S = 0.2


class _StopRequests:
    """Ctrl-C / SIGTERM presses, seen by every thread that waits on a trial: the signal itself
    reaches only the main thread, and parallel trials (one per GPU slot) wait in others.

    Only the main thread writes (the signal handler, a run's start); other threads only read.
    No lock: a signal handler that took one the main thread holds would deadlock.
    """

    count = 0

    def press(self) -> None:
        self.count += 1

    def reset(self) -> None:
        self.count = 0


stop_requests = _StopRequests()


def request_stop() -> None:
    """Ask every running trial to stop: the first call terminates them (SIGTERM, a grace period,
    SIGKILL), a second one kills them at once. Safe from a signal handler."""
    stop_requests.press()


def _wait(proc: subprocess.Popen[bytes], timeout_s: float, *, stop_at: int) -> None:
    """``proc.wait(timeout_s)`` that also ends with KeyboardInterrupt once ``stop_at`` presses
    were made, in whichever thread it runs."""
    deadline = time.monotonic() + timeout_s
    while True:
        if stop_requests.count >= stop_at:
            raise KeyboardInterrupt
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        try:
            proc.wait(timeout=min(_POLL_S, left))
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass(frozen=True)
class TrialSpec:
    """Everything a worker needs to run one config; serialised to the trial's ``spec.json``."""

    trial_dir: Path
    engine_kwargs: dict[str, Any]
    workload: dict[str, Any]
    requests_file: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    warmup_requests: int = 16
    timeout_s: float = 1200.0
    env: dict[str, str] = field(default_factory=dict)
    device_ids: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["trial_dir"] = str(self.trial_dir)
        return d


def _tail(path: Path, n: int = _TAIL_BYTES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - n))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _kill_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) PIDs of process group ``pgid``, from /proc; [] elsewhere."""
    members = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _reap_group(pgid: int, timeout_s: float = 30.0) -> None:
    """SIGKILL what is left of the group and wait until it is gone: a dying engine frees its
    memory only when its processes have exited, and the next trial needs that memory."""
    deadline = time.monotonic() + timeout_s
    while True:
        members = group_members(pgid)
        if not members:
            return
        _kill_group(pgid, signal.SIGKILL)
        if time.monotonic() > deadline:
            _logger.warning("processes %s of the trial outlived SIGKILL for %.0f s", members, timeout_s)
            return
        time.sleep(0.1)


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the worker's process group, then SIGKILL whatever is left after a grace period."""
    pgid = proc.pid
    _kill_group(pgid, signal.SIGTERM)
    try:
        with contextlib.suppress(subprocess.TimeoutExpired):
            _wait(proc, _KILL_GRACE_S, stop_at=2)
    finally:  # a second Ctrl-C during the grace period: kill now, then let it propagate
        _kill_group(pgid, signal.SIGKILL)
        proc.wait()


def run_trial(spec: TrialSpec) -> TrialResult:
    """Run ``spec`` in a fresh worker process and classify how it ended."""
    tdir = spec.trial_dir
    tdir.mkdir(parents=True, exist_ok=True)
    spec_path = tdir / "spec.json"
    write_json_atomic(spec_path, spec.to_json())
    out_path, err_path = tdir / "stdout.log", tdir / "stderr.log"
    env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1", "AUTOTUNE_PARENT_PID": str(os.getpid())}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    wait_for_idle_gpus(spec.device_ids, should_stop=lambda: stop_requests.count > 0)
    if stop_requests.count:  # Ctrl-C while this thread was between trials: start nothing
        raise KeyboardInterrupt
    sampler = GpuSampler(spec.device_ids).start()
    started = time.time()
    timed_out = False
    with out_path.open("ab") as out, err_path.open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.trial.worker", str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            start_new_session=True,  # its own session and process group: killed as one
        )
        try:
            _wait(proc, spec.timeout_s, stop_at=1)
        except subprocess.TimeoutExpired:
            timed_out = True
            _logger.warning("trial ran past its %.0f s timeout; killing its process group", spec.timeout_s)
            _terminate(proc)
        except BaseException:
            _terminate(proc)
            sampler.stop()
            raise
        finally:
            # engine-core children outlive a worker that died abruptly; nothing of a trial survives it
            _reap_group(proc.pid)
    sampler.stop()
    wall_s = time.time() - started

    with out_path.open(encoding="utf-8", errors="replace") as fh:
        events = list(protocol.parse(fh))
    outcome, error_type, error, metrics = classify(
        returncode=proc.returncode,
        timed_out=timed_out,
        events=events,
        stderr_tail=_tail(err_path) + "\n" + _tail(out_path, 16 * 1024),
    )
    phases = {e["phase"]: float(e["t"]) for e in events if e.get("event") == "phase"}
    engine = next((e for e in events if e.get("event") == "engine"), {})
    engine = {k: v for k, v in engine.items() if k != "event"}
    window = (phases["generate"], phases.get("shutdown", time.time())) if "generate" in phases else None
    telemetry = sampler.summary(window)
    if outcome is Outcome.SUCCESS:
        metrics["telemetry"] = telemetry
    result = TrialResult(
        outcome=outcome,
        metrics=metrics,
        error_type=error_type,
        error=error,
        returncode=proc.returncode,
        wall_s=wall_s,
        phases={k: v - started for k, v in phases.items()},
        engine=engine,
    )
    write_json_atomic(
        tdir / "result.json",
        {
            "outcome": outcome.value,
            "error_type": error_type,
            "error": error,
            "returncode": proc.returncode,
            "pid": proc.pid,
            "wall_s": wall_s,
            "phases_s": result.phases,
            "metrics": metrics,
            "engine": engine,
            "telemetry": telemetry,
            "params": spec.engine_kwargs,
            "stdout": str(out_path),
            "stderr": str(err_path),
        },
    )
    return result


def write_skipped(trial_dir: Path, params: dict[str, Any], reasons: list[str]) -> None:
    """Record a config that was never launched because it broke a constraint."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        trial_dir / "result.json",
        {
            "outcome": Outcome.INVALID.value,
            "error_type": "constraint",
            "error": "; ".join(reasons),
            "params": params,
        },
    )
