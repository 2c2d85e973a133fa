"""The isolated trial process: a hung generate is killed at the timeout, with its whole group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.outcome import Outcome
from autotune.runner import TrialSpec, group_members, run_trial

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_timeout_kills_the_process_group(tmp_path: Path, tiny_model: Path):
    # ~5 M output tokens: generate runs for minutes, far past the timeout
    spec = TrialSpec(
        trial_dir=tmp_path / "trial",
        engine_kwargs={
            "model": str(tiny_model),
            "enforce_eager": True,
            "kv_cache_memory_bytes": 64 << 20,
            "max_model_len": 1024,
        },
        workload={
            "kind": "synthetic",
            "count": 5000,
            "input_len": 16,
            "output_len": 1000,
            "prefix_len": 0,
            "seed": 0,
            "path": None,
        },
        timeout_s=60,
    )
    result = run_trial(spec)
    assert result.outcome is Outcome.TIMEOUT
    assert result.error_type == "timeout"
    assert "engine_start" in result.phases  # it got as far as the engine: a real hang, not a crash
    doc = json.loads((spec.trial_dir / "result.json").read_text())
    assert doc["outcome"] == "timeout"
    assert group_members(doc["pid"]) == []  # worker and engine-core children are all gone
    assert (spec.trial_dir / "stderr.log").stat().st_size > 0
