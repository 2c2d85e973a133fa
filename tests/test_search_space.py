from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.errors import SearchSpaceError
from autotune.space.load import build_space, load_space

BASE = {"parameters": {"max_num_seqs": {"type": "int", "low": 8, "high": 256, "log": True}}}


def test_bundled_spaces_load_against_installed_vllm(engine):
    for name in ("throughput", "cpu"):
        space = load_space(name, engine, gpus=1)
        assert space.parameters, name
        for p in space.parameters:
            assert p.name in engine.args


def test_tensor_parallel_bounded_by_gpus(engine):
    one = load_space("throughput", engine, gpus=1)
    assert "tensor_parallel_size" not in {p.name for p in one.parameters}
    assert one.fixed["tensor_parallel_size"] == 1
    four = load_space("throughput", engine, gpus=4)
    tp = next(p for p in four.parameters if p.name == "tensor_parallel_size")
    assert (tp.low, tp.high) == (1, 4)


def test_removed_argument_is_an_error_with_suggestions(engine):
    raw = {"parameters": {"swap_space": {"type": "int", "low": 1, "high": 8}}}
    with pytest.raises(SearchSpaceError, match=r"swap_space.*not an engine argument"):
        build_space(raw, engine)
    raw = {"parameters": {"max_num_seq": {"type": "int", "low": 1, "high": 8}}}
    with pytest.raises(SearchSpaceError, match="did you mean max_num_seqs"):
        build_space(raw, engine)


def test_unknown_fixed_argument_is_an_error(engine):
    with pytest.raises(SearchSpaceError, match=r"fixed\.num_scheduler_steps"):
        build_space({**BASE, "fixed": {"num_scheduler_steps": 8}}, engine)


def test_optional_parameter_missing_from_vllm_is_dropped(engine):
    raw = {"parameters": {"no_such_knob_xyz": {"type": "bool", "optional": True}, **BASE["parameters"]}}
    space = build_space(raw, engine)
    assert space.dropped == ("no_such_knob_xyz",)
    assert [p.name for p in space.parameters] == ["max_num_seqs"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "int", "low": 10, "high": 1}, r"low \(10\) is above high \(1\)"),
        ({"type": "int", "low": 0, "high": 8, "log": True}, "log scale needs low > 0"),
        ({"type": "categorical", "choices": []}, "non-empty 'choices'"),
        ({"type": "categorical", "choices": [8, 8]}, "duplicates"),
        ({"type": "integer", "low": 1, "high": 2}, "'type' must be one of"),
        ({"type": "int", "low": 1}, "needs 'low' and 'high'"),
        ({"type": "int", "low": 1, "high": 9, "lgo": True}, "unknown key"),
        ({"type": "bool"}, "type bool, but vLLM's max_num_seqs is int"),
        ({"type": "float", "low": 1.5, "high": 9}, "type float, but vLLM's max_num_seqs is int"),
        ({"type": "categorical", "choices": ["; rm -rf ~"]}, "not a valid int"),
    ],
)
def test_bad_ranges_are_errors_naming_the_field(engine, spec, message):
    with pytest.raises(SearchSpaceError, match=message) as info:
        build_space({"parameters": {"max_num_seqs": spec}}, engine, source="s.yaml")
    assert "parameters.max_num_seqs" in str(info.value)


def test_categorical_checked_against_vllm_choices(engine):
    raw = {"parameters": {"kv_cache_dtype": {"type": "categorical", "choices": ["auto", "fp9"]}}}
    with pytest.raises(SearchSpaceError, match="'fp9' is not one of vLLM's choices for kv_cache_dtype"):
        build_space(raw, engine)


def test_malformed_yaml_reports_line(tmp_path: Path, engine):
    bad = tmp_path / "bad.yaml"
    bad.write_text("parameters:\n  max_num_seqs: {type: int, low: 1\n  block_size: [\n")
    with pytest.raises(SearchSpaceError, match=r"malformed YAML at line \d+"):
        load_space(bad, engine)


def test_missing_space_file(engine):
    with pytest.raises(SearchSpaceError, match="no such file"):
        load_space("/nonexistent/space.yaml", engine)


def test_fixed_wins_and_degenerate_ranges_become_fixed(engine):
    raw = {
        "fixed": {"max_model_len": 2048},
        "parameters": {
            "max_model_len": {"type": "int", "low": 512, "high": 4096},
            "block_size": {"type": "categorical", "choices": [32]},
            "max_num_seqs": {"type": "int", "low": 16, "high": 16},
            "enable_prefix_caching": {"type": "bool"},
        },
    }
    space = build_space(raw, engine, extra_fixed={"enforce_eager": True})
    assert space.fixed == {"max_model_len": 2048, "enforce_eager": True, "block_size": 32, "max_num_seqs": 16}
    assert [p.name for p in space.parameters] == ["enable_prefix_caching"]


def test_suggest_stays_in_range(engine):
    space = load_space("throughput", engine, gpus=2)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(20):
        trial = study.ask()
        params = space.suggest(trial)
        assert 64 <= params["max_num_seqs"] <= 2048
        assert 0.80 <= params["gpu_memory_utilization"] <= 0.97
        assert params["kv_cache_dtype"] in ("auto", "fp8")
        study.tell(trial, 1.0)


def test_space_roundtrips_through_its_stored_form(engine):
    space = load_space("cpu", engine)
    again = build_space(space.to_dict(), engine, name=space.name)
    assert again.parameters == space.parameters
    assert again.fixed == space.fixed
    assert again.constraints == space.constraints


def test_bad_constraint_text(engine):
    with pytest.raises(SearchSpaceError, match="constraints\\[0\\]"):
        build_space({**BASE, "constraints": ["max_num_seqs >>= 4"]}, engine)
    with pytest.raises(SearchSpaceError, match="not an engine argument"):
        build_space({**BASE, "constraints": ["max_num_seqs <= max_num_sequences"]}, engine)
