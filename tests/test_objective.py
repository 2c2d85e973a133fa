from __future__ import annotations

import logging
from pathlib import Path

import optuna

from autotune.space.load import load_space
from autotune.study.lifecycle import enqueue_config
from autotune.study.settings import StudySettings
from autotune.trial.record import ROLE_ATTR, Role, TrialRecord
from autotune.tuning.objective import Objective
from autotune.tuning.resolved import record_resolved, resolved_params
from tests.helpers import objective_for


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


#: vLLM's resolved config for the H100 baseline of benchmarks/results/h100-2026-12-07 (its ``engine``)
H100_BASELINE_ENGINE = {
    "block_size": 16,
    "enable_prefix_caching": True,
    "cache_dtype": "auto",
    "gpu_memory_utilization": 0.92,
    "max_num_seqs": 1024,
    "max_num_batched_tokens": 16384,
    "async_scheduling": True,
    "long_prefill_token_threshold": 0,
    "enforce_eager": False,
    "quantization": None,
    "max_cudagraph_capture_size": 512,
}


def test_a_queued_trial_tells_the_sampler_what_vllm_resolved_for_its_unset_parameters(engine, tmp_path: Path):
    """The informed kv-fit config sets 2 keys; it ran with vLLM's values for the other 10, and TPE
    must learn from them (with only 2 recorded, its group decomposition kept the trial apart)."""
    space = load_space("throughput", engine, gpus=1)
    study = optuna.create_study(direction="maximize")
    informed = {"max_num_seqs": 234, "async_scheduling": True}
    enqueue_config(study, informed, space.parameters, role=Role.INFORMED)
    objective = Objective(
        settings=StudySettings.__new__(StudySettings), space=space, study_dir=tmp_path, timeout_s=60
    )
    trial = study.ask()
    kwargs = {"model": "m", **objective.config_for(trial)}
    assert trial.params == informed
    # vLLM derived CUDA graphs up to 468 (twice the batch): not a choice of the space, not recorded
    resolved = {**H100_BASELINE_ENGINE, "max_num_seqs": 234, "max_cudagraph_capture_size": 468}
    ran = TrialRecord(engine_kwargs=kwargs, engine=resolved)
    recorded = record_resolved(trial, space, ran)
    study.tell(trial, 9561.9)

    done = study.trials[0]
    unset = {p.name for p in space.parameters} - set(informed)
    assert set(recorded) == unset - {"max_cudagraph_capture_size"}
    assert done.params == {**informed, **recorded}
    assert recorded["quantization"] is None and recorded["attention_backend"] is None  # left to vLLM
    assert recorded["enforce_eager"] is False and recorded["gpu_memory_utilization"] == 0.92
    assert recorded["block_size"] == 16 and recorded["kv_cache_dtype"] == "auto"  # engine: cache_dtype
    for name in done.params:  # the space's own distributions: TPE models them together
        assert done.distributions[name] == next(p for p in space.parameters if p.name == name).distribution()
    # the config it ran with is unchanged: measured as written
    assert TrialRecord.of(done).config == informed

    sampled = study.ask()
    assert record_resolved(sampled, space, ran) == {}  # a sampled trial has its params
    assert (
        resolved_params(space.parameters, TrialRecord(engine_kwargs=kwargs), {}, space.fixed) == {}
    )  # no engine


def test_the_baseline_records_every_parameter_vllm_resolved_inside_the_space(engine):
    space = load_space("throughput", engine, gpus=1)
    base = TrialRecord(role=Role.BASELINE, engine_kwargs={"model": "m"}, engine=H100_BASELINE_ENGINE)
    values = resolved_params(space.parameters, base, {}, space.fixed)
    assert values == {
        "gpu_memory_utilization": 0.92,
        "kv_cache_dtype": "auto",
        "quantization": None,
        "attention_backend": None,
        "block_size": 16,
        "enable_prefix_caching": True,
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 16384,
        "long_prefill_token_threshold": 0,
        "enforce_eager": False,
        "max_cudagraph_capture_size": 512,
        "async_scheduling": True,
    }
    # off a categorical's choices: not recorded; outside a range: recorded (as Optuna records an
    # enqueued number), else a narrowed range would split the parameter from TPE's joint model
    odd = {**H100_BASELINE_ENGINE, "max_num_seqs": 4096, "block_size": 8, "cache_dtype": "fp8_e5m2"}
    values = resolved_params(space.parameters, TrialRecord(engine_kwargs={}, engine=odd), {}, space.fixed)
    assert values["max_num_seqs"] == 4096 and not {"block_size", "kv_cache_dtype"} & set(values)
    # what no distribution can hold is left out alone; the rest is still recorded
    bad = {**H100_BASELINE_ENGINE, "max_num_batched_tokens": None, "gpu_memory_utilization": "0.92"}
    values = resolved_params(space.parameters, TrialRecord(engine_kwargs={}, engine=bad), {}, space.fixed)
    assert not {"max_num_batched_tokens", "gpu_memory_utilization"} & set(values)
    assert values["enforce_eager"] is False and values["max_num_seqs"] == 1024


def test_a_config_that_sets_what_the_sampler_cannot_see_records_nothing_more(engine, caplog):
    space = load_space("throughput", engine, gpus=1)
    # an engine arg the space neither searches nor fixes, and a value off a categorical's choices
    # ... and a fixed one set anew (a config exported from another study, say)
    fixed_anew = {k: f"{v}-other" for k, v in list(space.fixed.items())[:1]}
    assert fixed_anew, "the throughput space fixes something"
    for config in (
        {"performance_mode": "throughput"},
        {"kv_cache_dtype": "fp8_e5m2", "max_num_seqs": 512},
        fixed_anew,
    ):
        record = TrialRecord(
            engine_kwargs={"model": "m", **space.fixed, **config}, engine=H100_BASELINE_ENGINE
        )
        known = {"max_num_seqs": 512} if "max_num_seqs" in config else {}
        assert resolved_params(space.parameters, record, known, space.fixed) == {}

    # a trial another worker finished meanwhile: the values are lost to the sampler, said so, no error
    study = optuna.create_study(direction="maximize")
    enqueue_config(study, {"max_num_seqs": 234}, space.parameters, role=Role.INFORMED)
    trial = study.ask()
    assert next(p for p in space.parameters if p.name == "max_num_seqs").suggest(trial) == 234
    study.tell(trial, 1.0)
    ran = TrialRecord(
        engine_kwargs={"model": "m", **space.fixed, "max_num_seqs": 234}, engine=H100_BASELINE_ENGINE
    )
    logger = logging.getLogger("autotune")
    logger.addHandler(caplog.handler)  # the package's logger may not propagate (autotune._logging)
    try:
        assert record_resolved(trial, space, ran) == {}
    finally:
        logger.removeHandler(caplog.handler)
    assert "were not all recorded for the sampler" in caplog.text


def test_a_queued_number_optuna_cannot_store_runs_as_written_unrecorded(engine, tmp_path: Path):
    """0 on a log range made the queued trial fail at suggest time, and Optuna records 4096.5 for
    an int as 4096 (not what the trial ran with): both go with the config, named outside the
    space; a whole number given as a float is stored as Optuna stores it."""
    space = load_space("throughput", engine, gpus=1)
    objective = objective_for(space, tmp_path)
    study = optuna.create_study(direction="maximize")
    config = {"max_num_seqs": 0, "max_num_batched_tokens": 4096.5, "gpu_memory_utilization": 0.9}
    outside = enqueue_config(study, config, space.parameters)
    assert outside == ["max_num_seqs=0", "max_num_batched_tokens=4096.5"]
    trial = study.ask()
    assert objective.config_for(trial) == {**space.fixed, **config}
    assert trial.params == {"gpu_memory_utilization": 0.9}
    study.tell(trial, 1.0)

    assert enqueue_config(study, {"max_num_seqs": 512.0}, space.parameters) == []
    trial = study.ask()
    objective.config_for(trial)
    assert trial.params == {"max_num_seqs": 512}
