"""The quality probe's comparison and the guard's verdict, without an engine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.space.lossy import lossy_changes
from autotune.study.settings import DEFAULT_QUALITY_BUDGET
from autotune.trial.probe import PROBE_FILE, ProbeMismatch, compare
from autotune.trial.record import Outcome, TrialRecord
from autotune.tuning.quality import Reference, judge


def _logprobs(probs: dict[int, float]) -> dict[str, float]:
    return {str(t): math.log(p) for t, p in probs.items()}


def _probe(positions: list[dict[int, float]], token_ids: list[int] | None = None) -> dict:
    ids = token_ids or list(range(2 + len(positions)))
    return {
        "logprobs": 20,
        "sequences": [{"prompt_len": 2, "token_ids": ids, "top": [_logprobs(p) for p in positions]}],
    }


def test_identical_probes_do_not_drift() -> None:
    probe = _probe([{1: 0.7, 2: 0.2}, {3: 0.5, 4: 0.4}])
    q = compare(probe, probe, reference_trial=0)
    assert q.kl_mean == pytest.approx(0.0, abs=1e-12)
    assert q.top1 == 1.0 and q.positions == 2 and q.reference == 0


def test_a_flipped_top_token_drifts() -> None:
    ref = _probe([{1: 0.7, 2: 0.2}, {3: 0.5, 4: 0.4}])
    cand = _probe([{1: 0.7, 2: 0.2}, {3: 0.3, 4: 0.6}])
    q = compare(ref, cand)
    assert q.top1 == 0.5
    # only the second position differs: KL over {3, 4, rest}
    expected = 0.5 * math.log(0.5 / 0.3) + 0.4 * math.log(0.4 / 0.6) + 0.1 * math.log(0.1 / 0.1)
    assert q.kl_mean == pytest.approx(expected / 2)
    assert q.kl_max == pytest.approx(expected)


@settings(max_examples=60, deadline=None)
@given(
    p=st.lists(st.floats(0.01, 1.0), min_size=8, max_size=8),
    q=st.lists(st.floats(0.01, 1.0), min_size=8, max_size=8),
    k=st.integers(1, 8),
)
def test_the_top_k_kl_never_exceeds_the_full_kl(p: list[float], q: list[float], k: int) -> None:
    """Merging the tokens outside the top-k into one bucket can only lower the KL divergence."""
    ps = [x / sum(p) for x in p]
    qs = [x / sum(q) for x in q]
    full = sum(a * math.log(a / b) for a, b in zip(ps, qs, strict=True))

    def top(dist: list[float]) -> dict[int, float]:
        return dict(sorted(enumerate(dist), key=lambda kv: -kv[1])[:k])

    got = compare(_probe([top(ps)]), _probe([top(qs)])).kl_mean
    assert got <= full + 1e-9


def test_probes_of_different_sequences_do_not_compare() -> None:
    ref = _probe([{1: 0.9}], token_ids=[5, 6, 7])
    with pytest.raises(ProbeMismatch):
        compare(ref, _probe([{1: 0.9}], token_ids=[5, 6, 8]))


def test_lossy_changes_name_what_changes_outputs() -> None:
    assert lossy_changes({"kv_cache_dtype": "fp8", "max_num_seqs": 8}, {}) == ["kv_cache_dtype=fp8"]
    assert lossy_changes({"kv_cache_dtype": "auto", "quantization": None}, {}) == []
    assert lossy_changes({"quantization": "fp8"}, {}) == ["quantization=fp8"]
    assert lossy_changes({"dtype": "float16"}, {"dtype": "bfloat16"}) == ["dtype=float16"]
    assert lossy_changes({"dtype": "bfloat16"}, {"dtype": "bfloat16"}) == []
    assert lossy_changes({"dtype": "float32"}, {}) == []


def _trial(tmp_path: Path, probe: dict | None) -> TrialRecord:
    tmp_path.mkdir(parents=True, exist_ok=True)
    if probe is not None:
        (tmp_path / PROBE_FILE).write_text(json.dumps(probe))
    return TrialRecord(outcome=Outcome.SUCCESS, metrics={"output_tokens_per_s": 1.0}, trial_dir=str(tmp_path))


def test_the_guard_prunes_drift_beyond_the_budget(tmp_path: Path) -> None:
    ref_probe = _probe([{1: 0.7, 2: 0.2}, {3: 0.5, 4: 0.4}])
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / PROBE_FILE).write_text(json.dumps(ref_probe))
    ref = Reference(0, tmp_path / "ref" / PROBE_FILE)
    drifted = _trial(tmp_path / "1", _probe([{1: 0.7, 2: 0.2}, {3: 0.3, 4: 0.6}]))

    over = judge(drifted, ref, budget=0.01, lossy=["kv_cache_dtype=fp8"])
    assert over.outcome is Outcome.QUALITY and over.error_type == "quality"
    assert "kv_cache_dtype=fp8" in (over.error or "") and over.metrics  # its speed is kept
    assert over.quality["budget"] == 0.01 and over.quality["top1"] == 0.5

    within = judge(drifted, ref, budget=1.0, lossy=["kv_cache_dtype=fp8"])
    assert within.outcome is Outcome.SUCCESS and within.quality["kl_mean"] > 0


def test_a_lossy_config_without_a_reference_never_wins_unmeasured(tmp_path: Path) -> None:
    result = _trial(tmp_path / "1", _probe([{1: 0.9}]))
    assert judge(result, None, 0.01, ["quantization=fp8"]).outcome is Outcome.QUALITY
    assert judge(result, None, 0.01, []).outcome is Outcome.SUCCESS  # lossless: nothing to fear


def test_dummy_weights_turn_the_check_off_and_say_so(engine, caplog: pytest.LogCaptureFixture) -> None:
    from autotune.space.load import load_space
    from autotune.tuning.request import RunRequest
    from autotune.tuning.session import _quality_budget

    space = load_space("throughput", engine, gpus=1, extra_fixed={"load_format": "dummy"})
    with caplog.at_level("WARNING"):
        assert _quality_budget(RunRequest(study="s"), space) is None
    assert "quality check OFF (dummy weights" in caplog.text
    assert "kv_cache_dtype, quantization change the model's outputs" in caplog.text
    real = load_space("throughput", engine, gpus=1)
    assert _quality_budget(RunRequest(study="s"), real) == DEFAULT_QUALITY_BUDGET
    assert _quality_budget(RunRequest(study="s", quality_budget=0.05), real) == 0.05
    assert _quality_budget(RunRequest(study="s", quality_check=False), real) is None


def test_a_quantized_checkpoint_is_not_quantized_again(engine, tmp_path: Path) -> None:
    from autotune.space.constraints import drop_requantization
    from autotune.space.load import load_space
    from autotune.trial.model_ref import quantization_method

    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "awq"}}))
    assert quantization_method(str(tmp_path)) == "awq"
    space = load_space("throughput", engine, gpus=1)
    kept, notes = drop_requantization(space, quantization_method(str(tmp_path)))
    assert "quantization" not in {p.name for p in kept.parameters} and "awq" in notes[0]
    assert drop_requantization(space, None) == (space, [])


def test_attention_backends_are_the_installed_vllms(engine, tmp_path: Path) -> None:
    from autotune.errors import SearchSpaceError
    from autotune.space.load import load_space

    space = load_space("throughput", engine, gpus=1)
    (backend,) = [p for p in space.parameters if p.name == "attention_backend"]
    assert backend.choices == (None, "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "parameters:\n  attention_backend: {type: categorical, choices: [FLASH_ATTN, WARP_DRIVE]}\n"
    )
    with pytest.raises(SearchSpaceError, match=r"WARP_DRIVE.*not one of vLLM's choices"):
        load_space(str(bad), engine, gpus=1)


def test_a_probe_that_failed_is_named_in_the_verdict(tmp_path: Path) -> None:
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / PROBE_FILE).write_text(json.dumps(_probe([{1: 0.9}])))
    result = _trial(tmp_path / "1", None)
    result = TrialRecord(
        outcome=Outcome.SUCCESS,
        metrics={"output_tokens_per_s": 1.0, "probe_error": "ValueError: boom"},
        trial_dir=result.trial_dir,
    )
    judged = judge(result, Reference(0, tmp_path / "ref" / PROBE_FILE), 0.01, ["kv_cache_dtype=fp8"])
    assert judged.outcome is Outcome.QUALITY and "ValueError: boom" in (judged.error or "")


def test_the_run_summary_names_an_unchecked_lossy_winner() -> None:
    from autotune.output.summary import format_summary

    summary = {
        "study": "s",
        "trials": {"COMPLETE": 2},
        "objective": "output_tokens_per_s",
        "best": {"trial": 1, "value": 2.0},
        "baseline_value": 1.0,
        "baseline_trial": 0,
        "speedup_over_baseline": 2.0,
        "validation": {"status": "not validated"},
        "quality": {"status": "not checked", "lossy": ["kv_cache_dtype=fp8"], "budget": None},
    }
    assert "quality NOT CHECKED" in format_summary(summary) and "kv_cache_dtype=fp8" in format_summary(
        summary
    )
    summary["quality"] = {
        "status": "within budget",
        "lossy": [],
        "budget": 0.02,
        "kl_mean": 0.01,
        "top1": 0.95,
    }
    assert "drift 0.0100 nats" in format_summary(summary)
