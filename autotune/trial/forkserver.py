"""A warm worker: one process imports vLLM once, then forks a fresh trial process per trial.

``import vllm`` costs a trial process 16-25 s on the H200 (9 s on 2 CPU cores) before it does
anything. A fork server pays it once: ``python -m autotune.trial.forkserver`` imports what the
worker needs (:func:`autotune.trial.worker.preload`; nothing touches CUDA), says it is ready, and
then, for each trial the tuner asks for, forks a child that starts a session of its own, points
its stdin/stdout/stderr at the trial's files and runs :func:`autotune.trial.worker.main` on the
spec. The child is as isolated as a trial started from scratch: a process (group) of its own,
killed as a group, with a fresh CUDA context (the server never initialises CUDA; vLLM's own
engine core is forked from the trial the same way). The server keeps nothing of a trial: each
child starts from the same copy of the server's memory.

The tuner talks to it through one JSON line each way on the server's stdin/stdout:

- the server: ``{"ready": true, "import_s": S}`` once, then per trial ``{"pid": PID}`` (the child,
  also its process group) and ``{"exit": PID, "returncode": RC}`` (negative: killed by a signal);
- the tuner: ``{"spec": PATH, "stdout": PATH, "stderr": PATH, "module": NAME}`` (the worker module
  that runs the trial, one of :data:`WORKER_MODULES`); closing stdin ends the server.

A server serves one GPU slot, one trial at a time, with the environment it was started with
(``CUDA_VISIBLE_DEVICES`` and the rest): the tuner keeps one per slot (:class:`ForkServer`) and
starts a new one when a trial's environment differs.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from autotune._logging import get_logger
from autotune.trial.process import stop_requests

_logger = get_logger(__name__)
#: the modules that run a trial (``main([SPEC]) -> exit status``): offline, serve
WORKER_MODULES = ("autotune.trial.worker", "autotune.trial.serve_worker")
#: how long a new server may take to import vLLM before the tuner gives up on it
START_TIMEOUT_S = 300.0
#: how often the server looks for its tuner while it waits
_POLL_S = 0.2


class ServerGone(RuntimeError):
    """The fork server died or said something unexpected (its log says why)."""


# -- the server (its own process) -----------------------------------------------------------------


def _child(request: dict[str, Any], channel: int, server: int, started: int) -> int:
    """In the forked child: become the trial's worker process (the offline or the serve one)."""
    os.close(channel)  # the server's line to the tuner is not the trial's
    os.setsid()  # its own session and process group, killed as one
    os.write(started, b"1")  # the server names this PID only now: a group exists to kill
    os.close(started)
    if os.getppid() != server:  # the server died while forking: nobody would supervise this trial
        return 1
    fd_in = os.open(os.devnull, os.O_RDONLY)
    fd_out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fd_err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, target in ((fd_in, 0), (fd_out, 1), (fd_err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.environ["AUTOTUNE_PARENT_PID"] = str(server)  # dies with the server (and its tuner)
    module = request.get("module", WORKER_MODULES[0])
    if module not in WORKER_MODULES:  # the tuner and this server disagree: say so in the trial's log
        print(
            f"fork server: no worker module {module!r}; known: {', '.join(WORKER_MODULES)}", file=sys.stderr
        )
        return 2
    main: Callable[[list[str]], int] = importlib.import_module(module).main
    return main([request["spec"]])


def _send(channel: int, **message: Any) -> None:
    os.write(channel, (json.dumps(message) + "\n").encode())


def _requests(stdin: int, tuner: int | None) -> Iterator[dict[str, Any]]:
    """The tuner's requests, one JSON line each, until it closes stdin or is gone."""
    buffer = b""
    while True:
        while b"\n" not in buffer:
            if tuner is not None and os.getppid() != tuner:
                return
            readable, _, _ = select.select([stdin], [], [], _POLL_S)
            if readable:
                chunk = os.read(stdin, 65536)
                if not chunk:
                    return
                buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        if line.strip():
            yield json.loads(line)


def _wait_child(pid: int, tuner: int | None) -> int:
    """The child's exit status; if the tuner dies meanwhile, the child's group goes first."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if tuner is not None and os.getppid() != tuner:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        time.sleep(_POLL_S)


def serve(stdin: int, tuner: int | None) -> int:
    """The server's loop: import, say ready, then fork one child per request until stdin closes
    or the tuner (PID ``tuner``) is gone. It runs no thread of its own: a fork copies only the
    forking thread, and one holding a lock elsewhere would leave it held in the child.

    Its stdout is the line to the tuner; what vLLM prints (to stdout too) goes to its stderr.
    """
    channel = os.dup(1)
    os.dup2(2, 1)
    from autotune.trial import worker

    t0 = time.perf_counter()
    worker.preload()
    if worker.device_initialised():  # a forked trial could not start the GPU: refuse to serve
        _send(channel, ready=False, error="importing vLLM initialised the GPU (CUDA) in the fork server")
        return 1
    server = os.getpid()
    _send(
        channel, ready=True, import_s=time.perf_counter() - t0, pid=server, threads=threading.active_count()
    )
    for request in _requests(stdin, tuner):
        sys.stdout.flush()  # nothing of the server's buffers may end up in a trial's log
        sys.stderr.flush()
        wait_r, wait_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child never returns into this loop
            code = 1
            try:
                os.close(wait_r)
                code = _child(request, channel, server, wait_w)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(wait_w)
        os.read(wait_r, 1)  # its session exists (or it died: end of file)
        os.close(wait_r)
        try:
            _send(channel, pid=pid)
            _send(channel, exit=pid, returncode=_wait_child(pid, tuner))
        except BrokenPipeError:  # the tuner is gone (its child was taken down with it)
            return 0
    return 0


def main() -> int:
    parent = os.environ.get("AUTOTUNE_PARENT_PID", "")
    return serve(sys.stdin.fileno(), int(parent) if parent.isdigit() else None)


# -- the tuner's side -----------------------------------------------------------------------------


class ForkedTrial:
    """A trial process forked by a :class:`ForkServer`, waited on like a ``subprocess.Popen``."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]) -> None:
        self.server, self.pid, self.args = server, pid, args
        self.returncode: int | None = None
        #: the server died under this trial: its exit status is unknown, and the trial never
        #: failed by itself (its process group dies with the server: the worker watches it)
        self.server_gone = False

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._read(left)
            if self.returncode is None and not os.path.exists(f"/proc/{self.pid}"):
                # gone and reaped, its exit message never read (an interrupt cut the read short)
                self.returncode = -9
        return self.returncode

    def _read(self, timeout: float | None) -> None:
        try:
            message = self.server.receive(timeout)
        except ServerGone:
            self.server_gone = True
            self.returncode = -9
            return
        if message is not None and message.get("exit") == self.pid:
            self.returncode = int(message["returncode"])


class ForkServer:
    """The tuner's handle on one fork server (one GPU slot's), started on first use.

    Args:
        env: The environment of every trial it forks (the slot's ``CUDA_VISIBLE_DEVICES`` too).
        log: Where the server's own stderr goes (its children write to their trial's files).
    """

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self._proc: subprocess.Popen[str] | None = None
        self._buffer = ""

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as err:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "autotune.trial.forkserver"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=self.env,
                text=True,
                start_new_session=True,  # a terminal's Ctrl-C reaches only the tuner
            )
        self._buffer = ""
        deadline = time.monotonic() + START_TIMEOUT_S
        ready = None
        while ready is None and time.monotonic() < deadline:
            if stop_requests.count:  # Ctrl-C while vLLM is imported: no trial was started yet
                self.close()
                raise KeyboardInterrupt
            ready = self.receive(0.5)
        if not ready or not ready.get("ready"):
            self.close()
            why = (ready or {}).get("error") or f"it did not start within {START_TIMEOUT_S:.0f} s"
            raise ServerGone(f"the fork server failed: {why} (log: {self.log})")
        _logger.info(
            "warm worker ready: vLLM imported once in %.1f s (pid %s)", ready["import_s"], ready["pid"]
        )

    def launch(self, spec: Path, stdout: Path, stderr: Path, module: str = WORKER_MODULES[0]) -> ForkedTrial:
        """Fork a trial process running ``spec`` with worker ``module`` (one of
        :data:`WORKER_MODULES`), its output to ``stdout`` and ``stderr``."""
        if not self.alive:
            self.start()
        assert self._proc is not None and self._proc.stdin is not None
        request = {"spec": str(spec), "stdout": str(stdout), "stderr": str(stderr), "module": module}
        try:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            self.close()
            raise ServerGone(f"the fork server is gone ({e}; log: {self.log})") from e
        answer = self.receive(60.0)
        if not answer or "pid" not in answer:
            self.close()
            raise ServerGone(f"the fork server did not fork a trial (log: {self.log})")
        return ForkedTrial(self, int(answer["pid"]), ["autotune.trial.forkserver", str(spec)])

    def receive(self, timeout: float | None) -> dict[str, Any] | None:
        """The server's next message, or None when none came within ``timeout`` seconds.

        Raises:
            ServerGone: it exited.
        """
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        while "\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                self.close()
                raise ServerGone(f"the fork server exited (log: {self.log})")
            self._buffer += chunk.decode("utf-8", "replace")
        line, self._buffer = self._buffer.split("\n", 1)
        try:
            return json.loads(line) if line.strip() else None
        except ValueError as e:
            self.close()
            raise ServerGone(
                f"the fork server said something unexpected ({line[:200]!r}; log: {self.log})"
            ) from e

    def close(self) -> None:
        """End the server (closing its stdin ends its loop; a kill if it does not)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class WarmWorkers:
    """The run's fork servers: one per trial running at once (a GPU slot each), started on
    first use with that trial's environment, kept while idle for the next trial with the same
    one, and ended by :meth:`close`.

    Args:
        log_dir: Where each server's own log goes (``forkserver-N.log``).
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._idle: list[ForkServer] = []
        self._count = 0
        self._lock = threading.Lock()
        #: a server failed: the rest of the run starts trials from scratch (no retry per trial)
        self.broken: str | None = None

    def disable(self, why: str) -> None:
        if self.broken is None:
            _logger.warning("warm workers off for the rest of this run: %s; trials start from scratch", why)
        self.broken = why

    def acquire(self, env: dict[str, str]) -> ForkServer | None:
        """An idle server started with ``env`` (or a new one, not started yet): the caller's
        until :meth:`release`; None once warm workers failed in this run."""
        if self.broken is not None:
            return None
        with self._lock:
            for server in self._idle:
                if server.env == env:
                    self._idle.remove(server)
                    return server
            self._count += 1
            return ForkServer(env, self.log_dir / f"forkserver-{self._count}.log")

    def release(self, server: ForkServer) -> None:
        """Keep ``server`` for the next trial with its environment (one per GPU slot: their
        environments differ in ``CUDA_VISIBLE_DEVICES``), or end it if it failed."""
        if not server.alive:
            server.close()
            return
        with self._lock:
            self._idle.append(server)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for server in idle:
            server.close()


if __name__ == "__main__":
    sys.exit(main())
