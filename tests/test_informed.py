"""The start-up configs the baseline informs: the batch its KV cache holds, fp8, throughput mode."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna

from autotune.space.load import load_space
from autotune.space.spec import ParamSpec
from autotune.trial.record import Outcome, Role, TrialRecord
from autotune.tuning.informed import _grid_at_least, informed_configs
from autotune.tuning.memory import MemoryPlan
from tests.helpers import objective_for

#: what a 7B baseline measured on the H200 (workload (a): 1000 requests of 256 + 256 tokens)
H200_7B = TrialRecord(
    Outcome.SUCCESS,
    {
        "output_tokens_per_s": 8424.0,
        "kv_cache_tokens": 234_000,
        "num_requests": 1000,
        "prompt_tokens": 256_000,
        "output_tokens": 256_000,
    },
    engine={"max_cudagraph_capture_size": 512},  # vLLM's default: min(2 x max_num_seqs, 512)
)


def test_the_batch_the_kv_cache_holds_with_and_without_fp8(engine) -> None:
    space = load_space("throughput", engine, gpus=1)
    configs = dict(informed_configs(H200_7B, space, engine.args))
    assert configs["kv-fit"] == {"max_num_seqs": 457, "async_scheduling": True}
    # 914 requests outgrow the baseline's CUDA graphs (up to 512): the config covers its batch
    assert configs["kv-fit-fp8"] == {
        "kv_cache_dtype": "fp8",
        "max_num_seqs": 914,
        "async_scheduling": True,
        "max_cudagraph_capture_size": 1024,
    }
    assert configs["kv-fit-fp8-weights"] == {"quantization": "fp8", **configs["kv-fit-fp8"]}
    assert ("throughput-mode" in configs) == ("performance_mode" in engine.args)


def test_values_stay_inside_the_space(engine) -> None:
    space = load_space("cpu", engine, gpus=1)  # max_num_seqs 16..1024, no kv_cache_dtype, no async
    huge = TrialRecord(Outcome.SUCCESS, {**H200_7B.metrics, "kv_cache_tokens": 10**8})
    configs = dict(informed_configs(huge, space, engine.args))
    assert configs["kv-fit"] == {"max_num_seqs": 1024}
    assert "kv-fit-fp8" not in configs and "kv-fit-fp8-weights" not in configs
    assert informed_configs(TrialRecord(Outcome.SUCCESS, {}), space, ()) == []  # nothing measured


def test_graphs_cover_the_batch_only_where_the_space_searches_them(engine) -> None:
    space = load_space("throughput", engine, gpus=1)
    small = TrialRecord(Outcome.SUCCESS, H200_7B.metrics, engine={"max_cudagraph_capture_size": 1024})
    assert "max_cudagraph_capture_size" not in dict(informed_configs(small, space, engine.args))["kv-fit-fp8"]
    huge = TrialRecord(
        Outcome.SUCCESS, {**H200_7B.metrics, "kv_cache_tokens": 2_000_000}, engine=H200_7B.engine
    )
    assert dict(informed_configs(huge, space, engine.args))["kv-fit"]["max_cudagraph_capture_size"] == 1024
    cpu = load_space("cpu", engine, gpus=1)  # no CUDA graphs searched
    assert all("max_cudagraph_capture_size" not in c for _, c in informed_configs(H200_7B, cpu, engine.args))


def test_they_run_right_after_the_baseline_behind_the_users_own(engine, tmp_path: Path, monkeypatch) -> None:
    space = load_space("throughput", engine, gpus=1)

    def run_trial(spec, **_):
        return TrialRecord(Outcome.SUCCESS, dict(H200_7B.metrics), trial_dir=str(spec.trial_dir))

    monkeypatch.setattr("autotune.tuning.measure.run_trial", run_trial)
    objective = objective_for(space, tmp_path, engine_args=frozenset(engine.args))
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({}, user_attrs=TrialRecord(role=Role.BASELINE).attrs())
    mine = {"max_num_seqs": 300}
    study.enqueue_trial(mine, user_attrs=TrialRecord(role=Role.ENQUEUED, config=mine).attrs())
    study.optimize(objective, n_trials=4)
    roles = [TrialRecord.of(t).role for t in study.trials[:4]]
    assert roles == [Role.BASELINE, Role.ENQUEUED, Role.INFORMED, Role.INFORMED]
    assert study.trials[2].params["max_num_seqs"] == 457  # recorded: the sampler learns from it
    assert TrialRecord.of(study.trials[3]).config == {
        "kv_cache_dtype": "fp8",
        "max_num_seqs": 914,
        "async_scheduling": True,
    }
    # a resumed study's baseline does not queue them twice
    objective._inform(optuna.Trial(study, study.trials[0]._trial_id), H200_7B)
    assert sum(TrialRecord.of(t).role is Role.INFORMED for t in study.get_trials()) == 3 + (
        "performance_mode" in engine.args
    )


def test_a_serve_load_caps_the_batch_and_skips_what_the_defaults_already_do(engine) -> None:
    """At 128 clients no batch holds more than 128 requests (the H100 serve study's kv-fit, 236
    sequences, measured the defaults again: x0.988)."""
    space = load_space("throughput", engine, gpus=1)
    served = {**H200_7B.metrics, "kv_cache_tokens": 120_896, "concurrency": 128}
    facts = {**H200_7B.engine, "max_num_seqs": 1024, "async_scheduling": True}
    defaults = TrialRecord(Outcome.SUCCESS, served, engine=facts)
    configs = dict(informed_configs(defaults, space, engine.args))
    assert "kv-fit" not in configs  # the defaults' 1024 sequences already reach 128, async on
    sync = TrialRecord(Outcome.SUCCESS, served, engine={**facts, "async_scheduling": False})
    assert dict(informed_configs(sync, space, engine.args))["kv-fit"] == {
        "max_num_seqs": 128,
        "async_scheduling": True,
    }  # asynchronous scheduling is news to these defaults
    small = TrialRecord(Outcome.SUCCESS, {**served, "kv_cache_tokens": 50_000}, engine=facts)
    assert dict(informed_configs(small, space, engine.args))["kv-fit"]["max_num_seqs"] == 97  # < 128
    assert configs["kv-fit-fp8"] == {"kv_cache_dtype": "fp8", "max_num_seqs": 128, "async_scheduling": True}
    assert configs["kv-fit-fp8-weights"] == {"quantization": "fp8", **configs["kv-fit-fp8"]}
    few = TrialRecord(Outcome.SUCCESS, served, engine={**H200_7B.engine, "max_num_seqs": 64})
    assert dict(informed_configs(few, space, engine.args))["kv-fit"]["max_num_seqs"] == 128
    rate = TrialRecord(Outcome.SUCCESS, {**served, "concurrency": None}, engine=defaults.engine)
    assert dict(informed_configs(rate, space, engine.args))["kv-fit"]["max_num_seqs"] == 236  # no cap


#: the H200 baseline's memory plan as vLLM 0.26 logged it (benchmarks/results/h200-2026-12-06-study)
H200_PLAN = {
    "gpu_gib": 139.8,
    "gpu_free_gib": 139.29,
    "weights_gib": 12.55,
    "kv_cache_gib": 114.37,
    "cudagraph_gib": 0.73,
    "beyond_gib": 0.72,  # 12.55 + 1.47 + 0.22 + 0.73 + 114.37 - 128.62 GiB asked for (0.92)
}
H200_MEASURED = TrialRecord(
    Outcome.SUCCESS,
    {**H200_7B.metrics, "kv_cache_tokens": 234_208},
    engine={"max_cudagraph_capture_size": 512, "gpu_memory_utilization": 0.92, "max_num_seqs": 1024},
    startup=H200_PLAN,
)


def test_the_memory_plan_predicts_what_the_h200_study_measured() -> None:
    plan = MemoryPlan.of(H200_MEASURED)
    assert plan is not None and MemoryPlan.of(H200_7B) is None  # no plan logged: no prediction
    # that study's fp8 KV trial held 468,304 tokens, fp8 weights + KV 492,432 (same utilisation)
    assert abs(plan.kv_tokens_at(fp8_kv=True) - 468_304) / 468_304 < 0.002
    predicted = plan.kv_tokens_at(fp8_kv=True, fp8_weights=True)
    assert 0.99 * 492_432 < predicted <= 492_432  # errs towards fewer tokens
    assert plan.kv_tokens_at(0.95) > plan.kv_tokens > plan.kv_tokens_at(0.85)
    u = plan.utilization_for(500_000, fp8_kv=True, fp8_weights=True)
    assert abs(plan.kv_tokens_at(u, fp8_kv=True, fp8_weights=True) - 500_000) < 10
    grid = ParamSpec("gpu_memory_utilization", "float", low=0.8, high=0.97, step=0.01)
    assert _grid_at_least(grid, 0.9501) == 0.96 and _grid_at_least(grid, 0.95) == 0.95


def test_one_wave_where_the_spaces_utilisation_holds_every_request(engine) -> None:
    """On the H200, fp8 weights + KV held 961 of the 1,000 requests at the baseline's 0.92: the
    config raises the utilisation (within the space) to hold all of them in one batch."""
    space = load_space("throughput", engine, gpus=1)
    configs = dict(informed_configs(H200_MEASURED, space, engine.args))
    wave = configs["kv-fit-fp8-weights"]
    assert wave["max_num_seqs"] == 1000 and wave["max_cudagraph_capture_size"] == 1024
    plan = MemoryPlan.of(H200_MEASURED)
    assert plan is not None and 0.92 < wave["gpu_memory_utilization"] <= 0.97
    assert plan.kv_tokens_at(wave["gpu_memory_utilization"], fp8_kv=True, fp8_weights=True) >= 512_000
    # bf16 weights would need more than the space's 0.97: the batch the KV cache holds instead
    assert (
        configs["kv-fit-fp8"]["max_num_seqs"] == 914 and "gpu_memory_utilization" not in configs["kv-fit-fp8"]
    )
    assert configs["kv-fit"] == {"max_num_seqs": 457, "async_scheduling": True}
    # a workload far beyond any utilisation: fp8 weights' larger batch, by the plan
    many = TrialRecord(
        Outcome.SUCCESS,
        {
            **H200_MEASURED.metrics,
            "num_requests": 4000,
            "prompt_tokens": 1_024_000,
            "output_tokens": 1_024_000,
        },
        engine=H200_MEASURED.engine,
        startup=H200_PLAN,
    )
    big = dict(informed_configs(many, space, engine.args))["kv-fit-fp8-weights"]
    assert big["max_num_seqs"] == plan.kv_tokens_at(fp8_kv=True, fp8_weights=True) // 512 > 914
    assert "gpu_memory_utilization" not in big
    # serve mode: the clients cap the batch, never a wave
    served = TrialRecord(
        Outcome.SUCCESS,
        {**H200_MEASURED.metrics, "concurrency": 128},
        engine=H200_MEASURED.engine,
        startup=H200_PLAN,
    )
    assert all("gpu_memory_utilization" not in c for _, c in informed_configs(served, space, engine.args))


def test_one_wave_stays_on_the_spaces_grid_inside_its_rules(engine) -> None:
    """Never a utilisation off the space's grid (which starts at its low end) or below it, never a
    wave for a served workload (its requests arrive over time) or one the space's rules forbid."""
    space = load_space("throughput", engine, gpus=1)
    at_rate = TrialRecord(
        Outcome.SUCCESS,
        {**H200_MEASURED.metrics, "concurrency": None, "request_rate": 10.0},
        engine=H200_MEASURED.engine,
        startup=H200_PLAN,
    )
    assert all("gpu_memory_utilization" not in c for _, c in informed_configs(at_rate, space, engine.args))
    params = [
        ParamSpec("gpu_memory_utilization", "float", low=0.805, high=0.975, step=0.01)
        if p.name == "gpu_memory_utilization"
        else p
        for p in space.parameters
    ]
    shifted = dataclasses.replace(space, parameters=tuple(params))
    wave = dict(informed_configs(H200_MEASURED, shifted, engine.args))["kv-fit-fp8-weights"]
    assert wave["gpu_memory_utilization"] == 0.965  # 0.805 + 16 steps (0.97 is off this grid)
    high = dataclasses.replace(
        space,
        parameters=tuple(
            ParamSpec("gpu_memory_utilization", "float", low=0.95, high=0.99, step=0.01)
            if p.name == "gpu_memory_utilization"
            else p
            for p in space.parameters
        ),
    )
    few = TrialRecord(
        Outcome.SUCCESS,
        {**H200_MEASURED.metrics, "num_requests": 915, "prompt_tokens": 234_240, "output_tokens": 234_240},
        engine=H200_MEASURED.engine,
        startup=H200_PLAN,
    )
    # the baseline ran at 0.92, below this space: its wave takes the space's low end at least
    assert dict(informed_configs(few, high, engine.args))["kv-fit-fp8"]["gpu_memory_utilization"] >= 0.95
    tight = dataclasses.replace(space, fixed={"max_num_batched_tokens": 512})  # < 1,000 requests
    assert (
        "gpu_memory_utilization"
        not in dict(informed_configs(H200_MEASURED, tight, engine.args))["kv-fit-fp8-weights"]
    )


def test_one_wave_leaves_room_for_its_cuda_graphs(engine) -> None:
    """vLLM 0.26 (Model Runner V2) captures the CUDA graphs beyond gpu_memory_utilization's share:
    on an H100 80GB, fp8 weights + KV at 0.97 with graphs to 1,024 ran out of memory at the first
    forward pass (benchmarks/results/h100-2026-12-06-resume, #23), at 0.96 it ran (#29)."""
    space = load_space("throughput", engine, gpus=1)
    # that H100's baseline as vLLM logged it (benchmarks/results/h100-2026-12-06-validation)
    h100 = {
        "gpu_gib": 79.18,
        "gpu_free_gib": 78.66,
        "weights_gib": 12.55,
        "kv_cache_gib": 58.6,
        "cudagraph_gib": 0.73,
        "beyond_gib": 0.72,  # 12.55 + 1.46 + 0.22 + 0.73 + 58.6 - 72.84
    }

    def wave(requests: int) -> dict:
        baseline = TrialRecord(
            Outcome.SUCCESS,
            {
                **H200_MEASURED.metrics,
                "kv_cache_tokens": 120_016,
                "num_requests": requests,
                "prompt_tokens": 256 * requests,
                "output_tokens": 256 * requests,
            },
            engine=H200_MEASURED.engine,
            startup=h100,
        )
        plan = MemoryPlan.of(baseline)
        assert plan is not None
        assert 0.96 < plan.max_utilization(1024) < 0.97 < plan.max_utilization()
        assert plan.utilization_for(int(requests * 512 * 1.01), fp8_kv=True, fp8_weights=True) < 0.97
        return dict(informed_configs(baseline, space, engine.args))["kv-fit-fp8-weights"]

    fits = wave(520)
    assert fits["max_num_seqs"] == 520 and fits["gpu_memory_utilization"] == 0.94
    held = wave(540)  # 0.97 would hold them, but not its graphs to 1,024 beside them
    assert "gpu_memory_utilization" not in held and held["max_num_seqs"] < 540
    # the H200's 139.8 GiB leave room for them at 0.97 (test_one_wave_where_...)
    plan = MemoryPlan.of(H200_MEASURED)
    assert plan is not None and plan.max_utilization(1024) > 0.97
    # a small card never bars the baseline's own utilisation at its own graphs, where it ran
    small = dataclasses.replace(plan, gpu_gib=15.0, free_gib=14.5, utilization=0.9, beyond_gib=0.5)
    assert small.max_utilization(512) == small.max_utilization() == 0.9 > small.max_utilization(1024)
    # a record without the whole usage line falls back on the graphs' own figure
    graphs_only = {k: v for k, v in H200_PLAN.items() if k != "beyond_gib"}
    fallback = MemoryPlan.of(dataclasses.replace(H200_MEASURED, startup=graphs_only))
    assert fallback is not None and fallback.beyond_gib == 0.73
    # where the log said neither, or not the free memory, nothing above the baseline's own
    # utilisation is known to fit (not the whole card: #23's 0.97 ran out of memory)
    for missing in (("beyond_gib", "cudagraph_gib"), ("gpu_free_gib",)):
        part = {k: v for k, v in h100.items() if k not in missing}
        blind = MemoryPlan.of(dataclasses.replace(H200_MEASURED, startup=part))
        assert blind is not None and blind.max_utilization(1024) == blind.max_utilization() == 0.92
