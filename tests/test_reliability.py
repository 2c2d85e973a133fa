"""Faults injected for real: SIGKILL and SIGINT of the tuner mid-trial, a second tuner on the same
SQLite study. Each on the real vLLM CPU engine with the tiny local Llama."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune.study.budget import counted_trials
from autotune.trial.process import group_members
from tests.helpers import autotune, worker_pid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
WORKLOAD = "synthetic:count=16,input_len=32,output_len=16"


def _start(tiny_model: Path, studies: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "autotune",
        "run",
        "--model",
        str(tiny_model),
        "--study",
        "s",
        "--studies-dir",
        str(studies),
        "--space",
        "cpu",
        "--workload",
        WORKLOAD,
        "--no-bar",
        "--validate-rounds",
        "0",
        *extra,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_engine_start(trial_dir: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    log = trial_dir / "stdout.log"
    while time.monotonic() < deadline:
        if log.is_file() and '"phase": "engine_start"' in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"trial in {trial_dir} never reached engine start")


def _gone(pgid: int, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _study(studies: Path) -> optuna.Study:
    return optuna.load_study(study_name="s", storage=f"sqlite:///{studies}/s.db")


def test_sigkill_mid_trial_then_resume_to_the_budget(tmp_path: Path, tiny_model: Path):
    studies = tmp_path / "studies"
    tuner = _start(tiny_model, studies, "--trials", "2")
    trial0 = studies / "s" / "trials" / "0"
    _wait_for_engine_start(trial0)
    pgid = worker_pid(trial0)
    os.kill(tuner.pid, signal.SIGKILL)
    tuner.wait()
    # the worker notices its tuner is gone and takes its engine processes down with it
    assert _gone(pgid), f"orphaned trial processes: {group_members(pgid)}"
    assert _study(studies).trials[0].state == optuna.trial.TrialState.RUNNING

    resumed = autotune(
        "run", "--study", "s", "--studies-dir", str(studies), "--no-bar", "--validate-rounds", "0"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "trial #0 was cut off" in resumed.stderr
    study = _study(studies)
    first = study.trials[0]
    assert first.state == optuna.trial.TrialState.FAIL
    assert first.user_attrs["error_type"] == "interrupted"
    assert counted_trials(study) == 2  # resumed to the budget of 2
    retry = study.trials[1]
    assert retry.user_attrs["autotune_retry_of"] == 0 and retry.user_attrs["autotune_role"] == "baseline"
    assert retry.state == optuna.trial.TrialState.COMPLETE
    again = autotune("run", "--study", "s", "--studies-dir", str(studies), "--no-bar")
    assert again.returncode == 0 and "has all 2 of its trials" in again.stderr


def test_second_run_refused_and_sigint_aborts_cleanly(tmp_path: Path, tiny_model: Path):
    studies = tmp_path / "studies"
    tuner = _start(tiny_model, studies, "--trials", "3")
    trial0 = studies / "s" / "trials" / "0"
    _wait_for_engine_start(trial0)
    pgid = worker_pid(trial0)

    second = autotune("run", "--study", "s", "--studies-dir", str(studies), "--trials", "1")
    assert second.returncode == 2
    assert "being run by another autotune process" in second.stderr and "Traceback" not in second.stderr

    os.kill(tuner.pid, signal.SIGINT)
    _, err = tuner.communicate(timeout=60)
    assert tuner.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert _gone(pgid, timeout_s=5)
    t0 = _study(studies).trials[0]
    assert t0.state == optuna.trial.TrialState.FAIL and t0.user_attrs["error_type"] == "interrupted"
