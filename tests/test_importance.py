"""The importance surrogates on studies whose truth is known, and on the real H200 study."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import optuna
import pytest

from autotune.analysis.importance import (
    ImportanceReport,
    compute_importance,
    fanova_importance,
    format_table,
    importance_section,
    infeasible_kind,
    trial_table,
)
from tests.synthetic import DEFAULTS, make_study

FAST = {"n_estimators": 40, "n_repeats": 3, "n_permutations": 2, "n_jobs": 1}
H200_DB = Path(__file__).resolve().parent.parent / "benchmarks/results/h200-2026-12-02/h200-llama2-7b.db"


@pytest.fixture(scope="module")
def synthetic() -> optuna.Study:
    return make_study(n=40, seed=0)


@pytest.fixture(scope="module")
def report(synthetic: optuna.Study) -> ImportanceReport:
    return compute_importance(synthetic, **FAST)


def test_regressor_ranks_the_parameter_that_drives_the_objective_first(report):
    reg = report.objective_model
    assert reg.status == "ok", reg.message
    assert reg.top(1) == ["max_num_batched_tokens"]
    assert reg.trustworthy and reg.score_mean is not None and reg.score_mean > 0.7
    top = reg.params[0]
    assert top.mean - 3 * top.std > 0  # clearly above its own noise
    assert all(p.mean < top.mean / 10 for p in reg.params[1:])
    # fANOVA agrees on what matters
    assert report.fanova.status == "ok"
    assert max(report.fanova.shares, key=report.fanova.shares.__getitem__) == "max_num_batched_tokens"
    assert not any(d.startswith("the top parameter") for d in report.disagreements)


def test_classifier_ranks_the_oom_product_first(report):
    cls = report.feasibility_model
    assert cls.status == "ok", cls.message
    assert set(cls.top(2)) == {"max_num_seqs", "max_model_len"}
    assert cls.score_mean is not None and cls.score_mean > 0.75
    assert cls.pairs and set(cls.pairs[0].names) == {"max_num_seqs", "max_model_len"}
    assert set(cls.classes) == {"oom", "success"}
    # the crash and the constraint-skipped trial are not evidence about memory
    assert any("constraints" in n for n in report.notes)
    assert any("crash" in n for n in report.notes)
    assert cls.n_trials == sum(cls.classes.values())


def test_terminal_table_and_json(report):
    text = format_table(report)
    assert "max_num_batched_tokens" in text and "R²" in text and "ROC AUC" in text
    assert "permuted together" in text
    doc = report.to_dict()
    json.dumps(doc, allow_nan=False)  # NaN would make the export invalid JSON
    assert doc["objective_model"]["params"][0]["name"] == "max_num_batched_tokens"
    assert doc["method"]["encoding"]["max_num_seqs"] == "numeric (log10)"


def test_encoding(synthetic):
    table = trial_table(synthetic)
    kinds = {f.name: (f.kind, f.log) for f in table.features}
    assert kinds["max_num_seqs"] == ("numeric", True)
    assert kinds["gpu_memory_utilization"] == ("numeric", False)
    assert kinds["block_size"] == ("ordinal", False)
    assert kinds["enable_prefix_caching"] == ("bool", False)
    assert kinds["kv_cache_dtype"] == ("onehot", False)
    by_name = {f.name: (f, g) for f, g in zip(table.features, table.groups, strict=True)}
    assert len(by_name["kv_cache_dtype"][1]) == 3
    # log-scaled params live in log space; the baseline's come from vLLM's resolved config
    row = table.numbers.index(0)
    assert table.raw[row]["max_num_seqs"] == DEFAULTS["max_num_seqs"]
    assert table.raw[row]["kv_cache_dtype"] == DEFAULTS["cache_dtype"]
    col = by_name["max_num_seqs"][1][0]
    assert table.X[row, col] == pytest.approx(math.log10(DEFAULTS["max_num_seqs"]))
    assert not table.imputed


def test_few_trials_is_a_plain_message():
    study = make_study(n=5, seed=1, name="few")
    report = compute_importance(study, **FAST)
    assert report.objective_model.status == "too_few"
    assert "not yet meaningful" in report.objective_model.message
    assert "autotune run --study few" in report.objective_model.message
    assert report.feasibility_model.status in ("too_few", "not_applicable")
    assert "not yet meaningful" in format_table(report)


def test_results_do_not_depend_on_n_jobs():
    study = make_study(n=20, seed=2, name="jobs")
    one = compute_importance(study, **{**FAST, "n_jobs": 1}, fanova=False)
    two = compute_importance(study, **{**FAST, "n_jobs": 2}, fanova=False)
    assert one.objective_model.params == two.objective_model.params
    assert one.feasibility_model.params == two.feasibility_model.params


def _frozen(state: optuna.trial.TrialState, **attrs: object) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(state=state, user_attrs=dict(attrs))


def test_which_failures_count_as_infeasible():
    pruned, fail = optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL
    assert infeasible_kind(_frozen(pruned, outcome="oom", error_type="oom")) == "oom"
    assert infeasible_kind(_frozen(pruned, outcome="invalid", error_type="constraint")) is None
    # recorded as a crash before the pattern existed: the error text still says "invalid config"
    msg = "Concurrent Partial Prefill is not supported. We recommend to remove it."
    assert (
        infeasible_kind(_frozen(fail, outcome="crash", error_type="NotImplementedError", error=msg))
        == "invalid"
    )
    assert (
        infeasible_kind(_frozen(fail, outcome="crash", error="CUDA out of memory. Tried to allocate"))
        == "oom"
    )
    assert infeasible_kind(_frozen(fail, outcome="crash", error="Segmentation fault")) is None
    assert infeasible_kind(_frozen(fail, outcome="timeout", error="ran past its timeout")) is None
    assert infeasible_kind(optuna.trial.create_trial(value=1.0)) is None


def test_export_section_never_raises(monkeypatch):
    import autotune.analysis.importance as importance

    study = optuna.create_study(directions=["maximize", "minimize"])  # ranks the first objective
    assert importance_section(study)["status"] == "ok"
    for error in (importance.ImportanceError("no scikit-learn"), RuntimeError("a bug")):

        def broken(*_, error=error, **__):
            raise error

        monkeypatch.setattr(importance, "compute_importance", broken)
        doc = importance_section(study)
        assert doc["status"] == "error" and str(error) in doc["message"]


@pytest.mark.skipif(not H200_DB.is_file(), reason=f"{H200_DB} is not in this checkout")
def test_real_h200_study(tmp_path):
    db = tmp_path / "h200.db"
    shutil.copy(H200_DB, db)
    study = optuna.load_study(study_name="h200-llama2-7b", storage=f"sqlite:///{db}")
    report = compute_importance(study, **FAST)
    reg, cls = report.objective_model, report.feasibility_model
    assert reg.status == "ok" and reg.n_trials == 12  # 11 sampled + the baseline at its defaults
    assert cls.status == "ok" and cls.classes == {"invalid": 5, "success": 12}
    # trials 2-6 drew max_num_partial_prefills > 1, which vLLM 0.26 V1 rejects
    assert cls.top(1) == ["max_num_partial_prefills"]
    assert report.fanova.status == "ok" and report.fanova.n_trials == 11
    assert any("counted as invalid" in n for n in report.notes)
    json.dumps(report.to_dict(), allow_nan=False)


def test_a_baseline_that_records_none_as_a_choice_stays_in_the_table():
    """A queued trial records what vLLM resolved (``tuning/resolved.py``); ``quantization=None`` is
    a choice there (vLLM decides), not a missing value, so the baseline is not left out."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    from autotune.study.settings import SETTINGS_ATTR, StudySettings
    from autotune.trial.record import ROLE_ATTR

    space = {
        "name": "s",
        "fixed": {},
        "parameters": {
            "quantization": {"type": "categorical", "choices": [None, "fp8"]},
            "max_num_seqs": {"type": "int", "low": 16, "high": 1024, "log": True},
        },
        "constraints": [],
    }
    dists = {
        "quantization": CategoricalDistribution([None, "fp8"]),
        "max_num_seqs": IntDistribution(16, 1024, log=True),
    }
    study = optuna.create_study(direction="maximize")
    settings = StudySettings(model="m", workload={"kind": "synthetic"}, space=space, vllm_version="0.0-test")
    study.set_user_attr(SETTINGS_ATTR, settings.to_dict())
    for i, (quant, seqs, value) in enumerate([(None, 256, 100.0), ("fp8", 512, 150.0), (None, 64, 80.0)]):
        params = {"quantization": quant, "max_num_seqs": seqs}
        attrs = {ROLE_ATTR: "baseline" if i == 0 else "sampled", "outcome": "success"}
        attrs["engine"] = {"max_num_seqs": seqs, "quantization": quant}
        attrs["engine_kwargs"] = {"model": "m"} if i == 0 else {"model": "m", **params}
        study.add_trial(
            optuna.trial.create_trial(params=params, distributions=dists, value=value, user_attrs=attrs)
        )
    table = trial_table(study)
    assert 0 in table.numbers
    assert not [n for n in table.notes if "left out" in n]


def test_fanova_holds_a_queued_trial_whose_resolved_value_lies_outside_the_range():
    """vLLM's default may lie outside a narrowed range; the queued trial records it (as Optuna
    records an enqueued number) and fANOVA's copy of the study must still take it."""
    from tests.synthetic import DISTRIBUTIONS

    study = make_study(n=20, seed=3, name="wide")
    study.enqueue_trial({}, user_attrs={"autotune_role": "enqueued"})
    trial = study.ask()
    values = {**DEFAULTS, "max_num_seqs": 4096, "kv_cache_dtype": "auto", "max_model_len": 2048}
    for name, dist in DISTRIBUTIONS.items():  # how tuning/resolved.py records them
        trial.storage.set_trial_param(trial._trial_id, name, dist.to_internal_repr(values[name]), dist)
    study.tell(trial, 1500.0)
    result = fanova_importance(study, seed=0)
    assert result.status == "ok", result.message
    assert result.n_trials == sum(
        t.state == optuna.trial.TrialState.COMPLETE and bool(t.params) for t in study.trials
    )
