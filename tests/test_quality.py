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
from autotune.tuning.quality import Plan, judge


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
    ref = Plan({}, 0, tmp_path / "ref" / PROBE_FILE)
    drifted = _trial(tmp_path / "1", _probe([{1: 0.7, 2: 0.2}, {3: 0.3, 4: 0.6}]))

    over = judge(drifted, ref, budget=0.01, lossy=["kv_cache_dtype=fp8"])
    assert over.outcome is Outcome.QUALITY and over.error_type == "quality"
    assert "kv_cache_dtype=fp8" in (over.error or "") and over.metrics  # its speed is kept
    assert over.quality["budget"] == 0.01 and over.quality["top1"] == 0.5

    within = judge(drifted, ref, budget=1.0, lossy=["kv_cache_dtype=fp8"])
    assert within.outcome is Outcome.SUCCESS and within.quality["kl_mean"] > 0


def test_a_lossy_config_without_a_reference_never_wins_unmeasured(tmp_path: Path) -> None:
    result = _trial(tmp_path / "1", _probe([{1: 0.9}]))
    none = Plan(None, missing="the baseline (trial #0) wrote no probe (ValueError: boom)")
    judged = judge(result, none, 0.01, ["quantization=fp8"])
    assert judged.outcome is Outcome.QUALITY and "trial #0) wrote no probe (ValueError: boom)" in str(
        judged.error
    )
    assert judge(result, none, 0.01, []).outcome is Outcome.SUCCESS  # lossless: nothing to fear


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
        metrics={"output_tokens_per_s": 1.0},
        quality={"probe_error": "ValueError: boom"},
        trial_dir=result.trial_dir,
    )
    judged = judge(result, Plan({}, 0, tmp_path / "ref" / PROBE_FILE), 0.01, ["kv_cache_dtype=fp8"])
    assert judged.outcome is Outcome.QUALITY and "ValueError: boom" in (judged.error or "")
    assert judged.quality == {"probe_error": "ValueError: boom"}  # not in the metrics


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


def test_a_token_the_config_rules_out_is_a_large_finite_drift() -> None:
    """vLLM reports -inf for a token a config gives no probability (and a broken one NaN): the
    KL stays a number, large, so the config is pruned rather than compared as NaN."""
    ref = _probe([{1: 0.9, 2: 0.05}])
    cand = _probe([{1: 0.9, 2: 0.05}])
    cand["sequences"][0]["top"][0]["1"] = float("-inf")
    q = compare(ref, cand)
    assert math.isfinite(q.kl_mean) and q.kl_mean > 10 and q.top1 == 0.0
    cand["sequences"][0]["top"][0]["1"] = float("nan")
    assert math.isfinite(compare(ref, cand).kl_mean) and compare(ref, cand).kl_mean > 10


def test_a_tie_for_first_place_agrees() -> None:
    ref = _probe([{1: 0.5, 2: 0.4}])
    tie = _probe([{2: 0.45, 1: 0.45}])  # listed in the other order, equally likely
    assert compare(ref, tie).top1 == 1.0


def test_a_packed_probe_reads_back_smaller() -> None:
    from autotune.trial.probe import pack, unpack

    probe = _probe([{t: 1.0 / (t + 2) for t in range(20)} for _ in range(32)])
    assert unpack(pack(probe)) == probe
    assert len(pack(probe)) < len(json.dumps(probe))
    with pytest.raises(ValueError, match="not a packed probe"):
        unpack("bm90IGEgcHJvYmU=")


def _guarded_objective(tmp_path: Path, probes: dict[str, dict], budget: float = 0.01):
    """An Objective with the guard on whose trials "run" by writing the probe ``probes`` holds
    for their config (``baseline``, or the kv_cache_dtype they set); returns it and the specs run."""
    from autotune.space.spec import ParamSpec, SearchSpace
    from autotune.study.settings import StudySettings
    from autotune.trial.spec import TrialSpec
    from autotune.tuning.objective import Objective

    ran: list[TrialSpec] = []

    def run_trial(spec: TrialSpec, **_: object) -> TrialRecord:
        ran.append(spec)
        spec.trial_dir.mkdir(parents=True, exist_ok=True)
        key = spec.engine_kwargs.get("kv_cache_dtype", "baseline")
        (spec.trial_dir / PROBE_FILE).write_text(json.dumps(probes[key]))
        return TrialRecord(Outcome.SUCCESS, {"output_tokens_per_s": 1.0}, trial_dir=str(spec.trial_dir))

    space = SearchSpace(
        "s",
        (
            ParamSpec("kv_cache_dtype", "categorical", choices=("auto", "fp8")),
            ParamSpec("max_model_len", "categorical", choices=(None, 1024, 4096)),
        ),
    )
    settings = StudySettings(model="m", workload={"kind": "synthetic"}, space={}, quality_budget=budget)
    objective = Objective(settings=settings, space=space, study_dir=tmp_path, timeout_s=0.1)
    return objective, ran, run_trial


def test_a_lossy_config_before_the_baseline_waits_for_it(tmp_path: Path, monkeypatch) -> None:
    """A lossy config whose turn comes before the baseline's probe exists (the baseline queued
    again behind it after a cold timeout, or running on another worker) is queued again,
    uncounted, and judged once the baseline is done: never pruned for a probe not yet written."""
    import optuna

    from autotune.study.budget import counted_trials
    from autotune.study.reference import stored_reference
    from autotune.trial.record import Role
    from autotune.tuning.measure import TrialFailed
    from autotune.tuning.quality import AWAITING_BASELINE, REFERENCE_FILE

    same = _probe([{1: 0.7, 2: 0.2}])
    drifted = _probe([{1: 0.3, 2: 0.6}])
    objective, ran, run_trial = _guarded_objective(tmp_path, {"baseline": same, "fp8": drifted})
    monkeypatch.setattr("autotune.tuning.measure.run_trial", run_trial)
    study = optuna.create_study(direction="maximize")
    lossy = {"kv_cache_dtype": "fp8", "max_model_len": 4096}
    study.enqueue_trial(lossy, user_attrs=TrialRecord(role=Role.ENQUEUED, config=lossy).attrs())
    study.enqueue_trial({}, user_attrs=TrialRecord(role=Role.BASELINE).attrs())
    study.optimize(objective, n_trials=3, catch=(TrialFailed,))

    first, base, again = study.trials
    assert first.state is optuna.trial.TrialState.FAIL
    assert TrialRecord.of(first).outcome is Outcome.DEFERRED and not TrialRecord.of(first).counted
    assert TrialRecord.of(again).retry_of == 0 and TrialRecord.of(again).retry_reason == AWAITING_BASELINE
    assert [s.engine_kwargs.get("kv_cache_dtype") for s in ran] == [None, "fp8"]  # nothing ran for #0
    assert ran[0].probe == {"max_len": 1024}  # the baseline's probe fits every trial's max_model_len
    assert ran[1].probe == {"reference": str(tmp_path / REFERENCE_FILE)}
    ref = stored_reference(study)
    assert ref is not None and ref.trial == base.number and ref.probe == same
    assert again.state is optuna.trial.TrialState.PRUNED
    record = TrialRecord.of(again)
    assert record.outcome is Outcome.QUALITY and record.quality["top1"] == 0.0 and record.metrics
    assert counted_trials(study) == 2
    # answered from the record, never measured twice: one write of the judged record
    assert json.loads((tmp_path / "trials" / "2" / "result.json").read_text())["outcome"] == "quality"


def test_the_reference_is_the_studys_not_a_hosts(tmp_path: Path, monkeypatch) -> None:
    """Another host cannot read the baseline's trial directory: the reference is in the study."""
    import shutil

    import optuna

    from autotune.trial.record import Role
    from autotune.tuning.measure import TrialFailed

    same = _probe([{1: 0.7, 2: 0.2}])
    objective, _, run_trial = _guarded_objective(tmp_path / "a", {"baseline": same, "auto": same})
    monkeypatch.setattr("autotune.tuning.measure.run_trial", run_trial)
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({}, user_attrs=TrialRecord(role=Role.BASELINE).attrs())
    study.optimize(objective, n_trials=1, catch=(TrialFailed,))
    shutil.rmtree(tmp_path / "a")  # the baseline's host is gone

    other, _, run_trial = _guarded_objective(tmp_path / "b", {"auto": same})
    monkeypatch.setattr("autotune.tuning.measure.run_trial", run_trial)
    config = {"kv_cache_dtype": "auto", "max_model_len": 4096}
    study.enqueue_trial(config, user_attrs=TrialRecord(role=Role.ENQUEUED, config=config).attrs())
    study.optimize(other, n_trials=1, catch=(TrialFailed,))
    record = TrialRecord.of(study.trials[1])
    assert record.outcome is Outcome.SUCCESS and record.quality["kl_mean"] == pytest.approx(0.0, abs=1e-12)


def test_a_baseline_without_a_probe_says_why_lossy_configs_are_pruned(tmp_path: Path, monkeypatch) -> None:
    import optuna

    from autotune.trial.record import Role
    from autotune.tuning import quality

    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({}, user_attrs=TrialRecord(role=Role.BASELINE).attrs())
    base = study.ask()
    TrialRecord(quality={"probe_error": "RuntimeError: no logprobs"}, log="/x/stderr.log").write(base)
    study.tell(base, 1.0)
    plan = quality.plan(study.ask(), tmp_path, wait_s=0)
    assert not plan.pending and plan.reference_path is None
    assert plan.missing == "the baseline (trial #0) wrote no probe (RuntimeError: no logprobs)"


def test_a_config_pruned_for_quality_is_not_run_again(tmp_path: Path) -> None:
    import optuna

    from autotune.study.trials import find_duplicate

    study = optuna.create_study(direction="maximize")
    kwargs = {"model": "m", "kv_cache_dtype": "fp8"}
    t = study.ask()
    TrialRecord(outcome=Outcome.QUALITY, error_type="quality", engine_kwargs=kwargs).write(t)
    study.tell(t, state=optuna.trial.TrialState.PRUNED)
    skip = study.ask()
    TrialRecord(outcome=Outcome.INVALID, error_type="constraint", engine_kwargs={"model": "m"}).write(skip)
    study.tell(skip, state=optuna.trial.TrialState.PRUNED)
    assert find_duplicate(study, kwargs) is not None and find_duplicate(study, kwargs).number == 0
    assert find_duplicate(study, {"model": "m"}) is None  # a constraint's skip is no measurement


def test_the_reference_is_stored_in_pieces_any_storage_takes(tmp_path: Path, monkeypatch) -> None:
    """A study user attribute is a TEXT column (64 KiB on MySQL): the probe goes in pieces."""
    import optuna

    from autotune.study import reference

    monkeypatch.setattr(reference, "CHUNK", 100)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s")
    probe = _probe([{t: 1.0 / (t + 2) for t in range(20)} for _ in range(8)])
    probe["sequences"][0]["text"] = "for people only"
    reference.store_reference(study, 0, probe)
    assert sum(k.startswith(reference.REFERENCE_ATTR + "_0_") for k in study.user_attrs) > 3
    again = reference.stored_reference(
        optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db")
    )
    assert again is not None and again.trial == 0
    assert again.probe["sequences"][0]["top"] == probe["sequences"][0]["top"]
    assert "text" not in again.probe["sequences"][0]


def test_a_failed_baseline_leaves_nothing_pending_and_lossy_configs_unrun(
    tmp_path: Path, monkeypatch
) -> None:
    """A baseline that failed for good (out of memory) never writes a probe: waiting for it
    would defer lossy configs forever; they are skipped unlaunched, uncounted, saying why."""
    import optuna

    from autotune.trial.record import Role
    from autotune.tuning import quality
    from autotune.tuning.measure import TrialFailed

    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({}, user_attrs=TrialRecord(role=Role.BASELINE).attrs())
    base = study.ask()
    TrialRecord(outcome=Outcome.OOM, error_type="oom", error="CUDA out of memory").write(base)
    study.tell(base, state=optuna.trial.TrialState.PRUNED)
    plan = quality.plan(study.ask(), tmp_path, wait_s=0)
    assert not plan.pending and plan.missing == "the study's baseline did not complete"

    objective, ran, run_trial = _guarded_objective(tmp_path, {})
    monkeypatch.setattr("autotune.tuning.measure.run_trial", run_trial)
    config = {"kv_cache_dtype": "fp8", "max_model_len": 4096}
    study.enqueue_trial(config, user_attrs=TrialRecord(role=Role.ENQUEUED, config=config).attrs())
    study.optimize(objective, n_trials=1, catch=(TrialFailed,))
    record = TrialRecord.of(study.trials[-1])
    assert study.trials[-1].state is optuna.trial.TrialState.PRUNED and not ran
    assert record.skipped and not record.counted and "no reference probe exists" in str(record.error)
