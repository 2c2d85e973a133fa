"""What got in a newcomer's way in their first hour (issue 20), each pinned by a test."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.space.load import load_space
from tests.helpers import autotune


def test_the_default_space_is_the_platforms(engine):
    space = load_space(None, engine)
    assert space.name == ("cpu" if engine.platform == "cpu" else "throughput")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_failed_baseline_ends_the_run_loudly_and_a_resume_says_why(tmp_path: Path, tiny_model: Path):
    # 256 KiB of KV cache for every trial: vLLM's defaults cannot hold one max-length sequence
    studies = tmp_path / "studies"
    common = ["--study", "s", "--studies-dir", str(studies), "--no-bar", "--trial-timeout", "300"]
    first = autotune(
        "run", "--model", str(tiny_model), "--trials", "4", "--set", "kv_cache_memory_bytes=262144",
        "--workload", "synthetic:count=8,input_len=16,output_len=8", *common,
    )  # fmt: skip
    assert first.returncode == 2 and "Traceback" not in first.stderr, first.stderr[-3000:]
    assert "the baseline (trial #0" in first.stderr and "[oom]" in first.stderr
    assert "larger than the available KV cache memory" in first.stderr
    assert "start a new --study" in first.stderr
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{studies}/s.db").trials
    assert len(trials) == 1  # nothing ran after it: every other config would be compared with nothing
    again = autotune("run", *common)
    assert again.returncode == 2 and "the baseline (trial #0" in again.stderr, again.stderr[-3000:]
    assert len(optuna.load_study(study_name="s", storage=f"sqlite:///{studies}/s.db").trials) == 1
    assert json.loads((studies / "s" / "trials" / "0" / "result.json").read_text())["outcome"] == "oom"


@pytest.mark.parametrize("name", ["cpu", "throughput"])
def test_every_bundled_space_holds_vllms_defaults_strictly_inside(engine, name):
    from autotune.space.load import defaults_outside

    # on a GPU box tensor_parallel_size is searched from 1, its default and its floor
    assert defaults_outside(load_space(name, engine, gpus=4), engine) == []


def test_a_range_that_tops_out_at_the_default_says_which_bound_to_widen(engine, tmp_path: Path):
    from autotune.space.load import build_space, defaults_outside

    seqs = engine.default("max_num_seqs")
    assert isinstance(seqs, int)  # resolved for this machine by the --describe worker
    raw = {"parameters": {"max_num_seqs": {"type": "int", "low": 1, "high": seqs, "log": True}}}
    (message,) = defaults_outside(build_space(raw, engine, source="my.yaml"), engine, source="my.yaml")
    assert "parameters.max_num_seqs" in message and f"widen 'high' above {seqs}" in message
