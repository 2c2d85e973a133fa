"""What a trial costs on the real CPU engine, cold workers against warm ones: the same 3-trial
study twice (same seed, same configs), compared by ``benchmarks.trial_cost``; the per-phase
seconds land in the test session's summary (CI's log)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import trial_cost
from tests.helpers import REPORTS, autotune

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def test_warm_workers_cut_the_import_and_measure_the_same_configs(tmp_path: Path, tiny_model: Path):
    studies = tmp_path / "studies"
    common = ["--model", str(tiny_model), "--space", "cpu", "--studies-dir", str(studies)]
    common += ["--workload", "synthetic:count=32,input_len=32,output_len=16", "--trials", "3", "--seed", "0"]
    common += ["--no-informed-start", "--no-early-stop", "--validate-rounds", "0", "--no-bar"]
    for name, extra in (("cold", ["--cold-workers"]), ("warm", [])):
        run = autotune("run", "--study", name, *common, *extra, timeout=1200)
        assert run.returncode == 0, run.stderr[-3000:]

    out = tmp_path / "cost"
    args = ["--out", str(out)]
    for name in ("cold", "warm"):
        args += ["--study", f"{name}={studies / name}.db:{name}"]
    assert trial_cost.main(args) == 0
    doc = json.loads((out / "trial_cost.json").read_text())
    cold, warm = doc["studies"]["cold"], doc["studies"]["warm"]
    assert cold["trials"] == warm["trials"] == 3
    assert len(doc["same_configs"]) == 3  # same seed: the same configs, trial by trial
    # the cold worker imports vLLM in every trial (~9 s on 2 cores); a forked one has it already
    assert cold["median_phase_s"]["import"] > 2.0
    assert warm["median_phase_s"]["import"] < 1.0
    assert warm["median_wall_s"] < cold["median_wall_s"]
    assert (out / "best_so_far.png").stat().st_size > 0
    REPORTS.append(
        (out / "trial_cost.md").read_text().replace("![best so far over wall time](best_so_far.png)", "")
    )
