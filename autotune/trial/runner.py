"""Run one trial in isolation: a worker subprocess in its own session, a timeout, a group kill.

Each trial gets an empty directory of its own, ``<study dir>/trials/<n>/``, holding ``spec.json``
(what was run), ``stdout.log`` and ``stderr.log`` (everything vLLM printed) and ``result.json``
(its :class:`~autotune.trial.record.TrialRecord`, written atomically once the process is gone).
A failure is data: it lands in ``result.json``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune._logging import get_logger
from autotune.atomic import write_json_atomic
from autotune.trial import protocol
from autotune.trial.forkserver import WORKER_MODULES, ForkServer, ServerGone, WarmWorkers
from autotune.trial.outcome import classify
from autotune.trial.process import TrialProcess, reap_group, stop_requests, terminate, wait
from autotune.trial.record import CONSTRAINT, Outcome, TrialRecord
from autotune.trial.spec import TrialSpec
from autotune.trial.startup import read_startup
from autotune.trial.telemetry import GpuSampler, machine, wait_for_idle_gpus

_logger = get_logger(__name__)
_TAIL_BYTES = 64 * 1024

__all__ = ["TrialSpec", "claim_dir", "run_trial", "write_skipped"]


def _tail(path: Path, n: int = _TAIL_BYTES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - n))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def claim_dir(trial_dir: Path) -> None:
    """Give a trial an empty directory of its own.

    Files already there belong to another trial (a study deleted and created again under the
    same name numbers its trials from 0 again): they are moved aside, never read as this trial's.
    """
    if trial_dir.is_dir() and any(trial_dir.iterdir()):
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = trial_dir.with_name(f"{trial_dir.name}.stale-{stamp}")
        n = 1
        while aside.exists():
            n += 1
            aside = trial_dir.with_name(f"{trial_dir.name}.stale-{stamp}-{n}")
        trial_dir.rename(aside)
        _logger.warning(
            "%s held the files of an earlier trial (a study deleted and created again under the "
            "same name?); moved them to %s",
            trial_dir,
            aside,
        )
    trial_dir.mkdir(parents=True, exist_ok=True)


class _Stop(Exception):
    """The trial's caller asked for it to stop (its pruner: behind at the same share of the work)."""


class _PhaseWatch:
    """Reads a running worker's stdout as it grows, reports each phase it enters and its progress,
    and stops the trial when ``should_stop`` says so."""

    def __init__(
        self,
        path: Path,
        pid: int,
        on_phase: Callable[[str], None] | None,
        on_progress: Callable[[float, float], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.path, self.pid, self.on_phase = path, pid, on_phase
        self.on_progress, self.should_stop = on_progress, should_stop
        self.measured = False
        self._offset = 0
        self._partial = ""

    def __call__(self) -> None:
        self._read()
        if self.should_stop is not None and not self.measured and self.should_stop():
            # the verdict rests on progress that may be seconds behind the worker (seen: 6 s, a
            # 2-core host running the CPU engine): one that has finished its timed run since
            # keeps its measurement and its quality probe
            self._read()
            if not self.measured:
                raise _Stop

    def _read(self) -> None:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return
        self._offset += len(chunk)
        lines = (self._partial + chunk.decode("utf-8", "replace")).split("\n")
        self._partial = lines.pop()
        for event in protocol.parse(lines, pid=self.pid):
            kind = event.get("event")
            if kind == "result" or (kind == "phase" and event.get("phase") in ("probe", "shutdown")):
                self.measured = True  # the timed run is over: nothing is stopped from here on
            try:
                if kind == "phase" and self.on_phase is not None:
                    self.on_phase(str(event.get("phase")))
                elif kind == "progress" and self.on_progress is not None and not self.measured:
                    self.on_progress(float(event["share"]), float(event["elapsed"]))
            except Exception as e:  # a display or storage hiccup must not end the trial
                _logger.warning(
                    "%s: could not handle the worker's %s event: %s", self.path.parent.name, kind, e
                )


def _launch(
    spec_path: Path,
    out_path: Path,
    err_path: Path,
    env: dict[str, str],
    server: ForkServer | None,
    warm: WarmWorkers | None,
    module: str,
) -> TrialProcess:
    """Start the trial's worker ``module``: forked by a warm worker, or from scratch (without one,
    or when it fails: a trial never fails for the warm worker's sake). A serve trial's worker
    forks vLLM's server from itself, so a warm one spares the server its imports too."""
    if server is not None and warm is not None:
        try:
            return server.launch(spec_path, out_path, err_path, module)
        except ServerGone as e:
            warm.disable(str(e))
    with out_path.open("wb") as out, err_path.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", module, str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            start_new_session=True,  # its own session and process group: killed as one
        )


def run_trial(
    spec: TrialSpec,
    on_phase: Callable[[str], None] | None = None,
    warm: WarmWorkers | None = None,
    on_progress: Callable[[float, float], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrialRecord:
    """Run ``spec`` in a fresh worker process and classify how it ended.

    Args:
        spec: What to run.
        on_phase: Called with each phase the worker enters (``engine_start``, ``generate``, ...),
            from the thread that waits on the trial.
        warm: Fork the worker from a warm worker that imported vLLM already (see
            :mod:`autotune.trial.forkserver`), instead of starting a fresh interpreter.
        on_progress: Called with ``(share of the requests finished, seconds of the timed run
            so far)`` as it goes (every 5 % of the requests).
        should_stop: Asked at every poll; True ends the trial there: ``Outcome.STOPPED`` with
            its partial figure (never a measurement).
    """
    tdir = spec.trial_dir
    claim_dir(tdir)
    spec_path = tdir / "spec.json"
    write_json_atomic(spec_path, spec.to_json())
    out_path, err_path = tdir / "stdout.log", tdir / "stderr.log"
    env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1", "AUTOTUNE_PARENT_PID": str(os.getpid())}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    wait_for_idle_gpus(spec.device_ids, should_stop=lambda: stop_requests.count > 0)
    if stop_requests.count:  # Ctrl-C while this thread was between trials: start nothing
        raise KeyboardInterrupt
    started = time.time()
    timed_out = stopped = False
    server = warm.acquire(env) if warm is not None else None
    try:
        module = WORKER_MODULES[1] if spec.serve is not None else WORKER_MODULES[0]
        proc = _launch(spec_path, out_path, err_path, env, server, warm, module)
        sampler = GpuSampler(spec.device_ids).start()
        watched = on_phase is not None or on_progress is not None or should_stop is not None
        tick = _PhaseWatch(out_path, proc.pid, on_phase, on_progress, should_stop) if watched else None
        try:
            wait(proc, spec.timeout_s, stop_at=1, tick=tick)
        except _Stop:
            stopped = True
            terminate(proc)
        except subprocess.TimeoutExpired:
            timed_out = True
            _logger.warning("trial ran past its %.0f s timeout; killing its process group", spec.timeout_s)
            terminate(proc)
        except BaseException:
            terminate(proc)
            sampler.stop()
            raise
        finally:
            # engine-core children outlive a worker that died abruptly; nothing of a trial survives it
            reap_group(proc.pid)
    finally:
        if warm is not None and server is not None:
            warm.release(server)  # one trial at a time: free once this one's process is gone
    sampler.stop()
    wall_s = time.time() - started

    with out_path.open(encoding="utf-8", errors="replace") as fh:
        events = list(protocol.parse(fh, pid=proc.pid))
    outcome, error_type, error, metrics = classify(
        returncode=proc.returncode,
        timed_out=timed_out,
        events=events,
        stderr_tail=_tail(err_path) + "\n" + _tail(out_path, 16 * 1024),
    )
    if stopped and outcome is not Outcome.SUCCESS:
        outcome, error_type, error, metrics = _stopped(events)
    elif getattr(proc, "server_gone", False) and outcome is not Outcome.SUCCESS:
        # the warm worker died under the trial (and took it along): not the config's failure
        assert warm is not None
        warm.disable("a warm worker died during a trial")
        outcome, error_type, error = (
            Outcome.INTERRUPTED,
            Outcome.INTERRUPTED.value,
            "the warm worker this trial was forked from died under it; its config runs again",
        )
    if "exit_after_result" in metrics:
        _logger.warning(
            "%s: the worker reported its measurement, then %s; the measurement stands (log: %s)",
            tdir.name,
            "ran past the trial timeout"
            if timed_out
            else f"died (exit status {metrics['exit_after_result']})",
            err_path,
        )
    phases = {e["phase"]: float(e["t"]) for e in events if e.get("event") == "phase"}
    engine: dict[str, Any] = next((e for e in events if e.get("event") == "engine"), {})
    end = phases.get("probe", phases.get("shutdown", time.time()))  # the timed run's end
    quality = _probe_outcome(spec, outcome, events, timed_out, proc.returncode)
    window = (phases["generate"], end) if "generate" in phases else None
    record = TrialRecord(
        outcome=outcome,
        metrics=metrics,
        error_type=error_type,
        error=error,
        telemetry=sampler.summary(window),
        engine={k: v for k, v in engine.items() if k not in ("event", "pid")},
        quality=quality,
        startup=read_startup(out_path, err_path) if "engine_start" in phases else {},
        wall_s=wall_s,
        phases_s={k: v - started for k, v in phases.items()},
        engine_kwargs=spec.engine_kwargs,
        trial_dir=str(tdir),
        log=str(err_path),
        gpus=tuple(spec.device_ids),
        machine=machine(list(spec.device_ids)),
        returncode=proc.returncode,
        pid=proc.pid,
        stdout=str(out_path),
    )
    record.write_json(tdir / "result.json")
    return record


def _stopped(events: list[dict[str, Any]]) -> tuple[Outcome, str, str, dict[str, Any]]:
    """How a trial its pruner stopped ended: how far it got, as a partial figure."""
    progress = [e for e in events if e.get("event") == "progress"]
    if not progress:
        return Outcome.STOPPED, "stopped", "stopped before its timed run reported progress", {}
    last = progress[-1]
    share, elapsed = float(last["share"]), float(last["elapsed"])
    return (
        Outcome.STOPPED,
        "stopped",
        f"stopped at {share:.0%} of its requests after {elapsed:.1f} s: even if the rest took no "
        "time, it could no longer reach the median of the study's completed trials (its pruner)",
        {
            "partial_share": share,
            "partial_elapsed_s": elapsed,
            "partial_output_tokens_per_s": float(last["output_tokens_per_s"]),
        },
    )


def _probe_outcome(
    spec: TrialSpec, outcome: Outcome, events: list[dict[str, Any]], timed_out: bool, returncode: int | None
) -> dict[str, Any]:
    """``{"probe_error": why}`` for a measured trial whose quality probe was asked for and not
    written; else empty (the parent compares the probe file itself)."""
    if spec.probe is None or outcome is not Outcome.SUCCESS:
        return {}
    probe = next((e for e in events if e.get("event") == "probe"), None)
    if probe is None:
        how = "ran past the trial timeout" if timed_out else f"the worker exited with status {returncode}"
        return {"probe_error": f"the probe did not finish: {how}"}
    return {"probe_error": str(probe["error"])} if probe.get("error") else {}


def write_skipped(trial_dir: Path, engine_kwargs: dict[str, Any], reasons: list[str]) -> TrialRecord:
    """Record a config that was never launched because it broke a constraint."""
    claim_dir(trial_dir)
    record = TrialRecord(
        outcome=Outcome.INVALID,
        error_type=CONSTRAINT,
        error="; ".join(reasons),
        engine_kwargs=engine_kwargs,
        trial_dir=str(trial_dir),
    )
    record.write_json(trial_dir / "result.json")
    return record
