from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def autotune(*args: str, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run the real ``autotune`` command line in a fresh interpreter."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
        check=False,
    )


def worker_pid(trial_dir: Path) -> int:
    """PID (= process group) of the live ``autotune.worker`` running ``trial_dir``'s spec."""
    spec = str(trial_dir / "spec.json").encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"autotune.worker" in cmd and spec in cmd:
            return int(entry.name)
    raise AssertionError(f"no worker process for {trial_dir}")
