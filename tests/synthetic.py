"""Synthetic autotune studies whose ground truth is known, for the importance/report/inspect tests.

The objective depends on ``max_num_batched_tokens`` alone (plus a little noise); a config runs out
of memory exactly when ``max_num_seqs x max_model_len`` (the KV cache it needs) passes a threshold.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from autotune.study.settings import SETTINGS_ATTR, StudySettings
from autotune.trial.record import ROLE_ATTR

DISTRIBUTIONS: dict[str, Any] = {
    "max_num_seqs": IntDistribution(16, 1024, log=True),
    "max_model_len": IntDistribution(256, 16384, log=True),
    "gpu_memory_utilization": FloatDistribution(0.5, 0.95),
    "block_size": CategoricalDistribution([16, 32, 64]),
    "enable_prefix_caching": CategoricalDistribution([False, True]),
    "kv_cache_dtype": CategoricalDistribution(["auto", "fp8", "fp8_e5m2"]),
    "max_num_batched_tokens": IntDistribution(256, 16384, log=True),
}
SPACE = {
    "name": "synthetic",
    "fixed": {"dtype": "bfloat16"},
    "parameters": {
        "max_num_seqs": {"type": "int", "low": 16, "high": 1024, "log": True},
        "max_model_len": {"type": "int", "low": 256, "high": 16384, "log": True},
        "gpu_memory_utilization": {"type": "float", "low": 0.5, "high": 0.95},
        "block_size": {"type": "categorical", "choices": [16, 32, 64]},
        "enable_prefix_caching": {"type": "bool"},
        "kv_cache_dtype": {"type": "categorical", "choices": ["auto", "fp8", "fp8_e5m2"]},
        "max_num_batched_tokens": {"type": "int", "low": 256, "high": 16384, "log": True},
    },
    "constraints": [],
}
DEFAULTS = {
    "max_num_seqs": 256,
    "max_model_len": 2048,
    "gpu_memory_utilization": 0.9,
    "block_size": 16,
    "enable_prefix_caching": True,
    "cache_dtype": "auto",
    "max_num_batched_tokens": 2048,
    "kv_cache_tokens": 100000,
}
#: a config needs more KV cache than there is beyond this (the baseline's 256 x 2048 fits)
OOM_PRODUCT = 2**19.5


def throughput(params: dict[str, Any], noise: float = 0.0) -> float:
    return 1000.0 + 2000.0 * math.log2(params["max_num_batched_tokens"] / 256) / 6 + noise


def draw(rng: np.random.Generator) -> dict[str, Any]:
    def log_int(d: IntDistribution) -> int:
        return round(math.exp(rng.uniform(math.log(d.low), math.log(d.high))))

    d = DISTRIBUTIONS
    return {
        "max_num_seqs": log_int(d["max_num_seqs"]),
        "max_model_len": log_int(d["max_model_len"]),
        "gpu_memory_utilization": float(rng.uniform(0.5, 0.95)),
        "block_size": [16, 32, 64][rng.integers(3)],
        "enable_prefix_caching": bool(rng.integers(2)),
        "kv_cache_dtype": ["auto", "fp8", "fp8_e5m2"][rng.integers(3)],
        "max_num_batched_tokens": log_int(d["max_num_batched_tokens"]),
    }


def make_study(
    storage: str | None = None,
    *,
    n: int = 40,
    seed: int = 0,
    name: str = "synthetic",
    telemetry: bool = True,
    extra_failures: bool = True,
    trial_root: str = "/nonexistent/studies/synthetic/trials",
) -> optuna.Study:
    """A study of a baseline and ``n`` sampled trials; OOMs pruned, the rest complete."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rng = np.random.default_rng(seed)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    settings = StudySettings(
        model="/models/synthetic-7b",
        workload={"kind": "synthetic", "count": 100, "input_len": 64, "output_len": 64},
        space=SPACE,
        vllm_version="0.0-test",
        distribution="vllm",
        platform="cuda" if telemetry else "cpu",
        gpus=["Test GPU"] if telemetry else [],
    )
    study.set_user_attr(SETTINGS_ATTR, settings.to_dict())

    def metrics(value: float) -> dict[str, Any]:
        m: dict[str, Any] = {"output_tokens_per_s": value, "total_tokens_per_s": 2 * value}
        if telemetry:
            m["telemetry"] = {"available": True, "mean_gpu_util_pct": float(rng.uniform(60, 99))}
        else:
            m["telemetry"] = {"available": False, "reason": "NVML unavailable (no NVIDIA GPU or driver)"}
        return m

    base_value = throughput({"max_num_batched_tokens": DEFAULTS["max_num_batched_tokens"]})
    study.add_trial(
        optuna.trial.create_trial(
            params={},
            distributions={},
            value=base_value,
            user_attrs={
                ROLE_ATTR: "baseline",
                "outcome": "success",
                "engine": dict(DEFAULTS),
                "engine_kwargs": {"model": settings.model, "dtype": "bfloat16"},
                "metrics": metrics(base_value),
                "trial_dir": f"{trial_root}/0",
                "wall_s": 30.0,
            },
        )
    )
    for i in range(1, n + 1):
        params = draw(rng)
        attrs: dict[str, Any] = {
            "trial_dir": f"{trial_root}/{i}",
            "engine_kwargs": {"model": settings.model, "dtype": "bfloat16", **params},
            "wall_s": float(rng.uniform(20, 60)),
        }
        # where its seconds went (the worker's phases, seconds after its start)
        attrs["phases_s"] = {
            "import": 0.5,
            "validate": 1.0,
            "engine_start": 1.5,
            "generate": 12.0,
            "shutdown": 18.0,
        }
        if params["max_num_seqs"] * params["max_model_len"] > OOM_PRODUCT:
            attrs.update(
                outcome="oom",
                error_type="oom",
                error="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            )
            state, value = optuna.trial.TrialState.PRUNED, None
        else:
            value = throughput(params, float(rng.normal(0, 20)))
            engine = {**DEFAULTS, **params, "cache_dtype": params["kv_cache_dtype"]}
            attrs.update(outcome="success", metrics=metrics(value), engine=engine)
            state = optuna.trial.TrialState.COMPLETE
        study.add_trial(
            optuna.trial.create_trial(
                params=params, distributions=DISTRIBUTIONS, value=value, state=state, user_attrs=attrs
            )
        )
    if extra_failures:
        for attrs in (
            {
                "outcome": "crash",
                "error_type": "crash",
                "error": "worker exited with code 1: Segmentation fault",
            },
            {
                "outcome": "invalid",
                "error_type": "constraint",
                "error": "max_num_batched_tokens < max_num_seqs",
            },
        ):
            state = (
                optuna.trial.TrialState.FAIL
                if attrs["outcome"] == "crash"
                else optuna.trial.TrialState.PRUNED
            )
            study.add_trial(
                optuna.trial.create_trial(
                    params=draw(rng), distributions=DISTRIBUTIONS, state=state, user_attrs=attrs
                )
            )
    return study
