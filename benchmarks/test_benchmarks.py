"""Unit tests of the benchmark helpers (no vLLM): ``pytest benchmarks/test_benchmarks.py``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import report
from benchmarks.compare import UsageError, parse_config, parse_set
from benchmarks.merge import merge
from benchmarks.models import ARCHS, DenseShape, param_count, write_arch
from benchmarks.roofline import Rates, dtype_bytes, floor_for


def test_param_counts_match_the_published_checkpoints() -> None:
    assert param_count(ARCHS["llama2-7b"]) == 6_738_415_616
    assert param_count(ARCHS["llama3.2-1b"]) == 1_235_814_400


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_arch_configs_load_in_transformers(name: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    path = write_arch(name, tmp_path / name)
    cfg = transformers.AutoConfig.from_pretrained(path)
    assert cfg.model_type == "llama"
    assert cfg.num_key_value_heads == ARCHS[name]["num_key_value_heads"]
    assert (
        json.loads((path / "generation_config.json").read_text())["eos_token_id"]
        == ARCHS[name]["eos_token_id"]
    )


def test_moe_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="mixture-of-experts"):
        DenseShape.from_config({**ARCHS["llama2-7b"], "num_local_experts": 8})


def _llama2_floor(**engine: Any) -> Any:
    shape = DenseShape.from_config(ARCHS["llama2-7b"])
    metrics = {"num_requests": 1000, "prompt_tokens": 256_000, "output_tokens": 256_000, "generate_s": 30.0}
    facts = {
        "max_num_seqs": 256,
        "kv_cache_tokens": 234_000,
        "dtype": "torch.float16",
        "cache_dtype": "auto",
        "block_size": 16,
        "enable_prefix_caching": True,
        **engine,
    }
    return floor_for(shape, Rates({"bfloat16": 750e12}, 4.0e12), metrics, facts)


def test_decode_is_memory_bound_and_steps_follow_the_batch() -> None:
    f = _llama2_floor()
    assert f.bound == "memory"
    assert f.batch == 256
    assert f.decode_steps == math.ceil(1000 / 256) * 256
    assert 15 < f.memory_s < 18  # 13.5 GB of weights x 1024 steps + ~51 TB of KV reads at 4 TB/s
    assert f.fraction == pytest.approx(f.floor_s / 30.0)
    # a KV cache for 100 full contexts caps the batch below max_num_seqs
    assert _llama2_floor(kv_cache_tokens=51_200).batch == 100


def test_fp8_kv_halves_the_kv_traffic_and_prefix_cache_cuts_compute() -> None:
    base = _llama2_floor()
    fp8 = _llama2_floor(cache_dtype="fp8")
    assert fp8.memory_s < base.memory_s
    assert dtype_bytes("fp8_e4m3") == 1
    shape = DenseShape.from_config(ARCHS["llama2-7b"])
    metrics = {"num_requests": 100, "prompt_tokens": 25_600, "output_tokens": 100, "generate_s": 1.0}
    facts = {"max_num_seqs": 256, "kv_cache_tokens": 10**6, "dtype": "float16", "block_size": 16}
    rates = Rates({"bfloat16": 750e12}, 4.0e12)
    cold = floor_for(shape, rates, metrics, {**facts, "enable_prefix_caching": False}, prefix_len=200)
    warm = floor_for(shape, rates, metrics, {**facts, "enable_prefix_caching": True}, prefix_len=200)
    assert warm.cached_prefix_tokens == 192
    assert warm.compute_s < cold.compute_s


def test_parse_config_reads_exports_and_drops_the_model(tmp_path: Path) -> None:
    export = tmp_path / "best.json"
    export.write_text(json.dumps({"engine_kwargs": {"model": "/x", "max_num_seqs": 64}}))
    cfg = parse_config(f"tuned=@{export}")
    assert (cfg.name, cfg.params, cfg.source) == ("tuned", {"max_num_seqs": 64}, str(export))
    assert parse_config("defaults={}").params == {}
    for bad in ("nojson", "x=[1]", "=", "a b={}"):
        with pytest.raises(UsageError):
            parse_config(bad)
    assert parse_set(["enforce_eager=true", "max_model_len=1024", "load_format=dummy"]) == {
        "enforce_eager": True,
        "max_model_len": 1024,
        "load_format": "dummy",
    }


def _trial(config: str, value: float | None) -> dict[str, Any]:
    if value is None:
        return {
            "config": config,
            "outcome": "oom",
            "error_type": "oom",
            "error": "CUDA out of memory",
            "metrics": {},
            "engine": {},
            "stderr": "log",
        }
    return {
        "config": config,
        "outcome": "success",
        "engine": {"max_num_seqs": 256, "vllm_version": "0.26.0"},
        "metrics": {
            "output_tokens_per_s": value,
            "total_tokens_per_s": 2 * value,
            "requests_per_s": 1.0,
            "engine_start_s": 20.0,
            "generate_s": 30.0,
        },
        "telemetry": {"mean_gpu_util_pct": 90.0, "peak_memory_bytes": 2**30},
    }


def _doc(trials: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    return {
        "command": "python -m benchmarks.compare ...",
        "started_at": "t0",
        "finished_at": "t1",
        "status": "complete",
        "device": "1 x H200",
        "model": {"arch": "a", "path": "p", "params": 7e9, "dtype": "float16", "shape": {}},
        "workload_description": "w",
        "fixed": {},
        "sampling": {},
        "warmup_requests": 16,
        "repeat": 1,
        "workload": {},
        "roofline": {"error": "skipped"},
        "configs": [{"name": n, "source": "cli", "params": {}, "engine_kwargs": {"x": n}} for n in names],
        "trials": trials,
        "summary": [],
    }


def test_report_has_ratios_and_failed_rows(tmp_path: Path) -> None:
    doc = _doc(
        [_trial("defaults", 100.0), _trial("seed", 110.0), _trial("big", None)],
        ["defaults", "seed", "big", "late"],  # `late`: the run was cut off before it
    )
    report.write(doc, tmp_path)
    rows = {r["config"]: r for r in doc["summary"]}
    assert rows["seed"]["vs_defaults"] == pytest.approx(1.1)
    assert rows["defaults"]["vs_seed"] == pytest.approx(100 / 110)
    assert rows["big"]["outcome"] == "oom" and rows["big"]["vs_defaults"] is None
    md = (tmp_path / "results.md").read_text()
    assert "| big | oom |" in md and "CUDA out of memory" in md and "×1.100" in md
    assert "**late**: not run (the run was interrupted before it)" in md and "None" not in md
    assert doc["vllm_version"] == "0.26.0"


def test_merge_pools_runs_and_refuses_mismatches() -> None:
    a = _doc([_trial("defaults", 100.0)], ["defaults"])
    b = _doc([_trial("defaults", 104.0), _trial("tuned", 120.0)], ["defaults", "tuned"])
    merged = merge([a, b])
    assert [c["name"] for c in merged["configs"]] == ["defaults", "tuned"]
    assert merged["repeat"] == 2
    with pytest.raises(ValueError, match="measured different things"):
        merge([a, {**b, "fixed": {"max_model_len": 1}}])
    b["configs"][0]["engine_kwargs"] = {"other": 1}
    with pytest.raises(ValueError, match="different engine args"):
        merge([a, b])


def test_best_after_n_trials_counts_the_budget_in_start_order(tmp_path) -> None:
    """The H200 study of 2026-12-06 (13 trials): its best after 10 was the 4th trial's, x1.339."""
    import shutil

    import optuna

    from benchmarks.trial_cost import best_after

    db = tmp_path / "s7b.db"
    shutil.copy(Path(__file__).parent / "results/h200-2026-12-06-study/s7b.db", db)
    study = optuna.load_study(study_name="s7b", storage=f"sqlite:///{db}")
    got = best_after(study)
    assert list(got) == ["10"]  # 20 and 30 not reached
    assert got["10"]["trial"] == 3 and got["10"]["vs_baseline"] == pytest.approx(1.339, abs=0.001)
    assert best_after(study, (4, 3))["3"]["trial"] == 2 and best_after(study, (4,))["4"]["trial"] == 3


def test_trial_cost_reads_a_pareto_serve_study_by_its_throughput(tmp_path) -> None:
    """The H100 Pareto serve study of 2026-12-06 (throughput, TTFT p99): its curve follows the
    throughput of trials within the SLOs, never one that missed them."""
    import shutil

    import optuna

    from benchmarks.trial_cost import study_cost

    db = tmp_path / "pareto7b.db"
    shutil.copy(Path(__file__).parent / "results/h100-2026-12-06-pareto/pareto7b.db", db)
    cost = study_cost(optuna.load_study(study_name="pareto7b", storage=f"sqlite:///{db}"), 1)
    assert cost["trials"] == 9 and cost["rated_trials"] == 8
    assert [p[2] for p in cost["best_so_far"]][-1] == 8 and cost["best_so_far"][-1][1] == pytest.approx(
        8973.0
    )
    assert {t["number"]: t["value"] for t in cost["per_trial"]}[4] == pytest.approx(
        5589.2, abs=0.1
    )  # missed TTFT


def test_a_study_resumed_a_day_later_is_drawn_on_its_busy_clock(tmp_path) -> None:
    """The H100 7B study's trials 0-14 ran on 2026-12-05, 15-22 and 23-29 in two sessions of
    2026-12-06: the best-so-far curve leaves the breaks out (it was drawn across a 21-hour one),
    as the trials-per-hour span does."""
    import itertools
    import shutil

    import optuna

    from benchmarks.trial_cost import study_cost

    db = tmp_path / "s7b.db"
    shutil.copy(Path(__file__).parent / "results/h100-2026-12-06-resume/s7b.db", db)
    cost = study_cost(optuna.load_study(study_name="s7b", storage=f"sqlite:///{db}"), 15)
    xs = [p[0] for p in cost["best_so_far"]]
    assert len(xs) == 30 and xs == sorted(xs)
    assert max(b - a for a, b in itertools.pairwise(xs)) < 400  # the longest trial: 275 s (a cold start)
    assert cost["rated_trials"] == 15 and cost["trials_per_hour"] == pytest.approx(27.8, abs=0.1)
    assert cost["best_after"]["20"]["trial"] == cost["best_after"]["30"]["trial"] == 13
    assert cost["compile_cache"] == {"miss": 13}


def test_a_trial_cut_off_by_a_break_is_drawn_at_the_breaks_start() -> None:
    """A run killed mid-trial: the trial is marked failed when the study resumes a day later, so
    its end lies inside the break; the curve must not jump over the break and back."""
    from datetime import datetime, timedelta

    import optuna

    from autotune.trial.record import TrialRecord
    from benchmarks.trial_cost import _busy_span, study_cost

    t0 = datetime(2026, 12, 6, 12, 0, 0)
    study = optuna.create_study(direction="maximize")
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}

    def add(start_s: float, end_s: float, wall: float, value: float | None) -> None:
        state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
        trial = optuna.trial.create_trial(
            state=state,
            value=value,
            params={"x": 0.5},
            distributions=dist,
            user_attrs=TrialRecord(wall_s=wall).attrs(),
        )
        trial.datetime_start = t0 + timedelta(seconds=start_s)
        trial.datetime_complete = t0 + timedelta(seconds=end_s)
        study.add_trial(trial)  # the template's times are kept

    add(0, 100, 100, 1.0)
    add(100, 200, 100, 2.0)
    add(200, 86_400, 50, None)  # killed 50 s in; failed at the resume, a day later
    add(86_400, 86_490, 90, 3.0)
    trials = study.get_trials(deepcopy=False)
    xs = [p[0] for p in study_cost(study)["best_so_far"]]
    assert xs == sorted(xs) and xs[-1] == pytest.approx(340.0)  # 100 + 100 + 50 + 90
    assert _busy_span(trials) == pytest.approx(340.0)


def test_a_shipped_tokenizer_sets_the_vocabulary_so_every_sampled_id_decodes(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from autotune.demo.tiny_model import build_tiny_llama

    tok_dir = build_tiny_llama(tmp_path / "tiny", vocab_size=300)
    path = write_arch("llama2-7b", tmp_path / "l7", tokenizer=tok_dir)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["vocab_size"] == len(tok) and cfg["hidden_size"] == 4096  # the layers stay 7B's
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (tok.bos_token_id, tok.eos_token_id)
    with pytest.raises(ValueError, match="no tokenizer files"):
        write_arch("llama2-7b", tmp_path / "x", tokenizer=tmp_path / "l7-missing")
