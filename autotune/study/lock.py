"""One ``autotune run`` at a time on a SQLite study: an advisory lock file beside the database.

SQLite serialises writers but is no place for two tuners on one GPU; parallel workers belong on a
server database (PostgreSQL), where Optuna's heartbeats keep them apart.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from autotune.errors import StudyError


@contextlib.contextmanager
def study_lock(path: Path, study: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for the block.

    Raises:
        StudyError: another process holds it (the message names its PID).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise StudyError(
                f"study {study!r} is being run by another autotune process (pid {holder}); wait "
                "for it to finish, or share the study through a PostgreSQL --storage to run "
                "workers in parallel"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock
