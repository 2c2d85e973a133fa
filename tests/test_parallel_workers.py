"""Several workers on one PostgreSQL study, for real: a real server (a throwaway one, see the
``postgres_url`` fixture), real trials on the CPU vLLM engine with the tiny Llama, a worker
killed with SIGKILL mid-trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest

from autotune.study.budget import counted_trials
from autotune.trial.process import group_members
from autotune.trial.record import RETRY_ATTR, UNCOUNTED, TrialRecord
from tests.helpers import fake_trials, objective_for, worker_pid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
WORKLOAD = "synthetic:count=16,input_len=32,output_len=16"
BUDGET = 5


def _worker(url: str, study: str, model: Path, studies: Path) -> subprocess.Popen[str]:
    """One `autotune run`, as each machine of a cluster would start it (its own studies dir)."""
    cmd = [sys.executable, "-m", "autotune", "run", "--model", str(model), "--study", study]
    cmd += ["--storage", url, "--studies-dir", str(studies), "--space", "cpu", "--workload", WORKLOAD]
    cmd += ["--trials", str(BUDGET), "--heartbeat", "1", "--no-bar", "--trial-timeout", "300"]
    cmd += ["--validate-rounds", "0"]  # validation has tests of its own
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _running_trial_dir(studies: Path, timeout_s: float = 240) -> Path:
    """The first trial of this worker that reached engine start."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for log in sorted(studies.glob("*/trials/*/stdout.log")):
            if '"phase": "engine_start"' in log.read_text(errors="replace"):
                return log.parent
        time.sleep(0.2)
    raise AssertionError(f"no trial of {studies} reached engine start")


def test_two_workers_share_the_budget_and_a_killed_one_loses_nothing(
    postgres_url: str, tiny_model: Path, tmp_path: Path
):
    name = f"par-{uuid.uuid4().hex[:8]}"
    dir_a, dir_b = tmp_path / "a", tmp_path / "b"
    a = _worker(postgres_url, name, tiny_model, dir_a)  # started together: both try to create it
    b = _worker(postgres_url, name, tiny_model, dir_b)
    try:
        killed_dir = _running_trial_dir(dir_a)
        pgid = worker_pid(killed_dir)
        os.kill(a.pid, signal.SIGKILL)
        a.communicate(timeout=30)
        _, err_b = b.communicate(timeout=900)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
    assert b.returncode == 0, err_b[-4000:]
    # the trial process of the killed worker noticed and took its engine down with it
    deadline = time.monotonic() + 30
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_members(pgid), "orphaned trial processes of the killed worker"

    study = optuna.load_study(study_name=name, storage=postgres_url)
    trials = study.get_trials()
    killed = next(t for t in trials if t.number == int(killed_dir.name))
    assert killed.state == optuna.trial.TrialState.FAIL  # not RUNNING forever
    retry = [t for t in trials if t.user_attrs.get(RETRY_ATTR) == killed.number]
    assert len(retry) == 1 and retry[0].state != optuna.trial.TrialState.WAITING  # its config ran again
    assert "heartbeats" in retry[0].user_attrs["autotune_retry_reason"]
    # the same config; a queued one (the baseline, say) adds what vLLM resolved for the rest
    assert killed.params.items() <= retry[0].params.items()
    assert TrialRecord.of(retry[0]).engine_kwargs == TrialRecord.of(killed).engine_kwargs
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]

    # the budget is global: exactly BUDGET trials used it, whichever worker ran them
    assert counted_trials(study) == BUDGET
    assert study.user_attrs["autotune_heartbeat_s"] == 1  # stored: every worker judges alike
    # each worker ran its own trials: the killed one's dir is in a/, its retry's in b/
    assert (dir_b / name / "trials" / str(retry[0].number)).is_dir()
    assert not (dir_a / name / "trials" / str(retry[0].number)).exists()
    # no config measured twice, but for the killed trial's retry
    launched = [
        t
        for t in trials
        if t.state.is_finished()
        and t.number != killed.number
        and t.user_attrs.get("error_type") not in UNCOUNTED
    ]
    # by engine args, as the tuner judges duplicates: an informed config may set args outside
    # the space (performance_mode), so its params can be empty like the baseline's
    keys = [json.dumps(TrialRecord.of(t).engine_kwargs, sort_keys=True) for t in launched]
    assert len(keys) == len(set(keys)), keys
    assert (
        sum(t.user_attrs.get("autotune_role") == "baseline" for t in trials if t.number != killed.number) == 1
    )


@pytest.mark.timeout(300)
def test_two_workers_with_parallel_slots_keep_the_budget_exact(
    postgres_url: str, engine, tmp_path: Path, monkeypatch
):
    """Optuna's threads (one per GPU slot) in two workers at once on one PostgreSQL study: four
    trials run at a time near the end, and the budget still comes out exact. The trial process is
    replaced by a sleep; what is tested is the bookkeeping around it."""
    import threading

    from autotune.space.load import build_space
    from autotune.study.storage import open_storage
    from autotune.tuning.objective import TrialFailed
    from autotune.tuning.placement import SlotPool, plan_slots
    from autotune.tuning.stopping import StopRules

    fake_trials(monkeypatch, sleep_s=0.3)
    name = f"threads-{uuid.uuid4().hex[:8]}"
    optuna.create_study(study_name=name, storage=postgres_url, direction="maximize")
    space = build_space(
        {"name": "t", "parameters": {"max_num_seqs": {"type": "int", "low": 1, "high": 100_000}}},
        engine,
        source="test",
    )
    budget = 9

    def worker(k: int) -> None:
        study = optuna.load_study(study_name=name, storage=open_storage(postgres_url, heartbeat_s=1))
        slots = plan_slots([2 * k, 2 * k + 1], 1, visible=list(range(4)), platform="cuda")
        objective = objective_for(space, tmp_path / str(k), pool=SlotPool(slots), budget=budget)
        progress = StopRules(budget=budget, parallel=2)
        study.optimize(objective, n_jobs=2, callbacks=[progress], catch=(TrialFailed,))

    threads = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    study = optuna.load_study(study_name=name, storage=postgres_url)
    assert counted_trials(study) == budget
    ran = [t for t in study.trials if "gpus" in t.user_attrs]
    assert len(ran) == budget  # what was over the budget never took a slot
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in ran)
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
