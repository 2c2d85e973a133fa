"""A trial's process group: wait on it, stop it on request, and make sure nothing of it survives.

Every trial runs in its own session (so a terminal's Ctrl-C reaches only the tuner) and is killed
as a group (SIGTERM, a grace period, SIGKILL), taking vLLM's engine-core children with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from autotune._logging import get_logger

_logger = get_logger(__name__)
KILL_GRACE_S = 10.0
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


class TrialProcess(Protocol):
    """A trial's worker process: a ``subprocess.Popen``, or one a fork server forked
    (:class:`autotune.trial.forkserver.ForkedTrial`). Its PID is its process group's."""

    pid: int
    args: Any
    returncode: int | None

    def wait(self, timeout: float | None = None) -> int: ...


def request_stop() -> None:
    """Ask every running trial to stop: the first call terminates them (SIGTERM, a grace period,
    SIGKILL), a second one kills them at once. Safe from a signal handler."""
    stop_requests.press()


def wait(
    proc: TrialProcess, timeout_s: float, *, stop_at: int, tick: Callable[[], None] | None = None
) -> None:
    """``proc.wait(timeout_s)`` that also ends with KeyboardInterrupt once ``stop_at`` presses
    were made, in whichever thread it runs; ``tick`` is called at every poll."""
    deadline = time.monotonic() + timeout_s
    while True:
        if tick is not None:
            tick()
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


def reap_group(pgid: int, timeout_s: float = 30.0) -> None:
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


def terminate(proc: TrialProcess) -> None:
    """SIGTERM the worker's process group, then SIGKILL whatever is left after a grace period."""
    pgid = proc.pid
    _kill_group(pgid, signal.SIGTERM)
    try:
        with contextlib.suppress(subprocess.TimeoutExpired):
            wait(proc, KILL_GRACE_S, stop_at=2)
    finally:  # a second Ctrl-C during the grace period: kill now, then let it propagate
        _kill_group(pgid, signal.SIGKILL)
        proc.wait()
