from __future__ import annotations

from pathlib import Path

import optuna

from autotune.space.load import load_space
from autotune.study.lifecycle import enqueue_config
from autotune.study.settings import StudySettings
from autotune.trial.record import ROLE_ATTR
from autotune.tuning.objective import Objective


def test_an_enqueued_config_runs_as_written_with_defaults_for_the_rest(engine, tmp_path: Path):
    space = load_space("throughput", engine, gpus=1)
    names = {p.name for p in space.parameters}
    seed = {"gpu_memory_utilization": 0.92, "block_size": 32, "max_num_seqs": 512, "enforce_eager": True}
    assert set(seed) <= names and len(names) > len(seed)
    study = optuna.create_study(direction="maximize")
    assert enqueue_config(study, seed, space.parameters) == []
    objective = Objective(
        settings=StudySettings.__new__(StudySettings), space=space, study_dir=tmp_path, timeout_s=60
    )
    trial = study.ask()
    assert trial.user_attrs[ROLE_ATTR] == "enqueued"
    config = objective.config_for(trial)
    assert config == {**space.fixed, **seed}  # nothing sampled beside the hand-tuned keys
    assert trial.params == seed  # what the surrogate sees; the rest resolve to vLLM's defaults

    # a sampled trial still gets every searched parameter
    study.tell(trial, 1.0)
    sampled = study.ask()
    assert set(objective.config_for(sampled)) == set(space.fixed) | names


def test_an_enqueued_value_outside_a_categorical_runs_as_written_unrecorded(engine, tmp_path: Path):
    """Seen on the H200: kv_cache_dtype=fp8_e5m2 (the space offers auto and fp8) ended the whole
    run with Optuna's error when its turn came; now it runs as written, beside the space."""
    space = load_space("throughput", engine, gpus=1)
    study = optuna.create_study(direction="maximize")
    seed = {"kv_cache_dtype": "fp8_e5m2", "max_num_seqs": 512}
    assert enqueue_config(study, seed, space.parameters) == ["kv_cache_dtype='fp8_e5m2'"]
    objective = Objective(
        settings=StudySettings(model="m", workload={"kind": "synthetic"}, space={}),
        space=space,
        study_dir=tmp_path,
        timeout_s=60,
    )
    trial = study.ask()
    assert objective.config_for(trial) == {**space.fixed, **seed}
    assert trial.params == {"max_num_seqs": 512}
