"""Validation rounds end to end on the real CPU engine (issue 16): a short study, then its best
config and vLLM's defaults measured again in rounds; kill -9 during validation, resume, and the
rounds already measured are kept, none measured twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune.study.validation import measurements, validation_name
from autotune.trial.record import TrialRecord
from tests.helpers import autotune

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
WORKLOAD = "synthetic:count=64,input_len=16,output_len=32"


def _val(studies: Path) -> optuna.Study:
    return optuna.load_study(study_name=validation_name("s"), storage=f"sqlite:///{studies}/s.db")


def test_validation_survives_kill_9_and_states_its_verdict(tmp_path: Path, tiny_model: Path):
    studies = tmp_path / "studies"
    where = ["--study", "s", "--studies-dir", str(studies)]
    search = autotune(
        "run", "--model", str(tiny_model), *where, "--workload", WORKLOAD, "--trials", "3",
        "--validate-rounds", "0", "--no-bar", "--trial-timeout", "300",
    )  # fmt: skip
    assert search.returncode == 0, search.stderr[-3000:]
    assert "not validated" in search.stdout

    cmd = [sys.executable, "-m", "autotune", "validate", *where, "--top", "1", "--rounds", "2", "--no-bar"]
    tuner = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # kill it once one measurement is in and another runs
        time.sleep(1)
        try:
            trials = _val(studies).get_trials()
        except KeyError:
            continue
        states = [t.state for t in trials]
        if optuna.trial.TrialState.COMPLETE in states and optuna.trial.TrialState.RUNNING in states:
            break
    else:
        pytest.fail("validation never had a finished and a running measurement")
    os.kill(tuner.pid, signal.SIGKILL)
    tuner.wait()
    kept = {t.number: t.value for t in _val(studies).get_trials() if t.state.name == "COMPLETE"}

    resumed = autotune("validate", *where, "--top", "1", "--rounds", "2", "--no-bar")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "cut off by an earlier run" in resumed.stderr
    val = _val(studies)
    for number, value in kept.items():  # what was measured before the kill stands, unchanged
        assert val.trials[number].value == value
    finished = [m for m in measurements(val) if m.finished]
    slots = [(m.round, m.validates) for m in finished]
    assert len(slots) == len(set(slots)) == 4  # 2 rounds x (the best config + the baseline), once each
    interrupted = [t for t in val.trials if TrialRecord.of(t).error_type == "interrupted"]
    assert len(interrupted) == 1 and TrialRecord.of(val.trials[-1]).validates is not None

    assert "validated: " in resumed.stdout  # the verdict, in words
    assert "95 % CI" in resumed.stdout or "keep vLLM's defaults" in resumed.stdout
    out = tmp_path / "best.json"
    exported = autotune("export", *where, "--out", str(out), "--no-importance")
    assert exported.returncode == 0, exported.stderr[-2000:]
    doc = json.loads(out.read_text())["validation"]
    assert doc["status"] == "validated" and doc["rounds"] == 2
    assert {"speedup", "speedup_ci95", "noise_cv", "verdict", "candidates"} <= set(doc)
    (candidate,) = doc["candidates"]
    assert len(candidate["ratios"]) == 2 and candidate["ci95"] is not None
    assert "VALIDATED" in autotune("ls", "--studies-dir", str(studies)).stdout
    assert "Validation: 2 round(s)" in autotune("show", *where).stdout
