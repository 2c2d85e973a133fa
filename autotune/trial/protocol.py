"""The one channel from a trial's worker process to the parent: tagged JSON lines on stdout.

The worker prints lines ``@@autotune {"event": ..., "pid": PID}``; anything else on stdout (vLLM's own logs)
is ignored by the parent. Events:

- ``{"event": "phase", "phase": NAME, "t": UNIX_TIME}`` when a phase starts
  (``import``, ``validate``, ``engine_start``, ``warmup``, ``generate``, ``probe``, ``shutdown``);
- ``{"event": "engine", ...}`` facts about the engine once it is up (vLLM version, KV cache);
- ``{"event": "progress", "share": S, "elapsed": SEC, "output_tokens_per_s": R}`` each time
  another 5 % of the timed run's requests have finished (vLLM's own rate estimate so far);
- ``{"event": "result", "metrics": {...}}`` once, as soon as the timed run is measured;
- ``{"event": "probe", "file": NAME}`` or ``{"event": "probe", "error": STR}`` once the quality
  probe (when the spec asks for one) is written or has failed;
- ``{"event": "error", "error_type": STR, "error": STR}`` once, on a caught failure.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

TAG = "@@autotune "


def emit(event: str, fd: int = 1, **fields: Any) -> None:
    """Write one event as a single ``write`` so lines from other processes never split it."""
    line = "\n" + TAG + json.dumps({"event": event, "pid": os.getpid(), **fields}, default=str) + "\n"
    os.write(fd, line.encode())


def parse(lines: Iterable[str], *, pid: int | None = None) -> Iterator[dict[str, Any]]:
    """Yield the events in ``lines``, skipping everything that is not a well-formed event.

    Args:
        lines: A worker's stdout.
        pid: Only the events of the process with this PID (every event carries its ``pid``).
    """
    for line in lines:
        idx = line.find(TAG)
        if idx < 0:
            continue
        try:
            event = json.loads(line[idx + len(TAG) :])
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and "event" in event and (pid is None or event.get("pid") == pid):
            yield event
