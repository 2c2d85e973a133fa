from __future__ import annotations

import os
import subprocess
import sys
import time
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
    """PID (= process group) of the live worker running ``trial_dir``'s spec: the process whose
    events its stdout holds (a fresh ``python -m autotune.trial.worker``, or one a warm worker
    forked, whose command line is the fork server's)."""
    from autotune.trial import protocol

    lines = (trial_dir / "stdout.log").read_text(errors="replace").splitlines()
    for event in protocol.parse(lines):
        pid = int(event["pid"])
        if Path(f"/proc/{pid}").exists() and os.getpgid(pid) == pid:
            return pid
    raise AssertionError(f"no worker process for {trial_dir}")


def fake_trials(monkeypatch, value=lambda spec: 1.0, sleep_s: float = 0.0) -> list:
    """Replace the trial process by a success worth ``value(spec)`` (after ``sleep_s``), for
    tests of the bookkeeping around trials; returns the specs "run", in order."""
    from autotune.trial.record import Outcome, TrialRecord

    ran: list = []

    def run_trial(spec, **_):
        time.sleep(sleep_s)
        ran.append(spec)
        return TrialRecord(Outcome.SUCCESS, {"output_tokens_per_s": value(spec)})

    monkeypatch.setattr("autotune.tuning.measure.run_trial", run_trial)
    return ran


def objective_for(space, study_dir: Path, **kw):
    """An Objective of a study of model ``m`` on a synthetic workload."""
    from autotune.study.settings import StudySettings
    from autotune.tuning.objective import Objective

    settings = StudySettings(model="m", workload={"kind": "synthetic"}, space={})
    return Objective(settings=settings, space=space, study_dir=study_dir, timeout_s=60, **kw)


#: measurements a test made on the real engine, printed at the end of the test session (CI's log)
REPORTS: list[str] = []
