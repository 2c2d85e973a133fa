"""Property-based tests (hypothesis) of the parsers users feed by hand: whatever the input, the
search-space and workload parsers either accept it or raise their own error, never anything else;
what they accept behaves as declared."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.errors import SearchSpaceError, WorkloadError
from autotune.space.load import build_space
from autotune.trial.workload import load_requests, parse_workload

PROPERTY = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
names = st.sampled_from(
    ["max_num_seqs", "block_size", "gpu_memory_utilization", "enable_prefix_caching", "swap_space", "x"]
)
specs = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["int", "float", "categorical", "bool", "str", 3]),
        "low": scalars,
        "high": scalars,
        "log": scalars,
        "step": scalars,
        "choices": values,
        "optional": st.booleans(),
    },
)
raw_spaces = st.one_of(
    values,
    st.fixed_dictionaries(
        {},
        optional={
            "parameters": st.one_of(values, st.dictionaries(names, st.one_of(specs, values), max_size=4)),
            "fixed": st.one_of(values, st.dictionaries(names, scalars, max_size=3)),
            "constraints": st.one_of(values, st.lists(st.text(max_size=30), max_size=3)),
            "name": st.text(max_size=8),
        },
    ),
)


@PROPERTY
@given(raw=raw_spaces)
def test_any_space_mapping_is_accepted_or_a_search_space_error(engine, raw):
    try:
        space = build_space(raw, engine, source="prop")
    except SearchSpaceError as e:
        assert str(e).startswith("prop")  # the message names where the fault is
        return
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    config = space.suggest(study.ask())
    for p in space.parameters:
        v = config[p.name]
        if p.type in ("int", "float"):
            assert p.low <= v <= p.high
        elif p.type == "categorical":
            assert v in p.choices


ranges = st.tuples(st.integers(-5, 5000), st.integers(-5, 5000), st.booleans())


@PROPERTY
@given(bounds=ranges)
def test_an_int_range_is_accepted_exactly_when_it_is_valid(engine, bounds):
    low, high, log = bounds
    raw = {"parameters": {"max_num_seqs": {"type": "int", "low": low, "high": high, "log": log}}}
    valid = low <= high and (not log or low > 0)
    try:
        space = build_space(raw, engine, source="prop")
    except SearchSpaceError as e:
        assert not valid, e
        assert "max_num_seqs" in str(e)
        return
    assert valid
    in_space = space.parameters or ()
    assert in_space or space.fixed["max_num_seqs"] == low  # low == high: fixed, not searched


@PROPERTY
@given(text=st.text(max_size=60))
def test_any_workload_string_is_a_spec_or_a_workload_error(text):
    try:
        wl = parse_workload(text)
    except WorkloadError as e:
        assert "--workload" in str(e)
        return
    assert wl.kind in ("synthetic", "jsonl", "sharegpt")


lines = st.one_of(
    st.builds(lambda p: json.dumps({"prompt": p}), st.text(min_size=1, max_size=20)),
    st.builds(json.dumps, values),
    st.text(max_size=20),
)


@PROPERTY
@given(body=st.lists(lines, min_size=0, max_size=8))
def test_a_jsonl_file_loads_or_names_its_bad_line(tmp_path_factory, body):
    path = tmp_path_factory.mktemp("wl") / "prompts.jsonl"
    text = "\n".join(body)
    path.write_text(text, encoding="utf-8")
    try:
        records = load_requests(parse_workload(f"jsonl:{path}"))
    except WorkloadError as e:
        msg = str(e)
        assert str(path) in msg
        if f"{path}:" in msg:  # a line is at fault: its number is real and it is that line
            number = int(msg.split(f"{path}:")[1].split()[0].rstrip(":"))
            bad = text.split("\n")[number - 1]
            assert bad.strip(), "a blank line was blamed"
        return
    assert records and all(("prompt" in r) or ("prompt_token_ids" in r) for r in records)
    assert len(records) == len([line for line in text.split("\n") if line.strip()])


def _jsonl_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "p.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(WorkloadError) as info:
        load_requests(parse_workload(f"jsonl:{path}"))
    return str(info.value).replace(str(path), "FILE")


def test_a_bad_line_among_good_ones_is_reported_by_number(tmp_path: Path):
    msg = _jsonl_error(tmp_path, '{"prompt": "a"}\n\n{"prompt": "b"}\n{oops\n')
    assert "FILE:4 is not valid JSON" in msg


# what the properties found, kept as plain regressions
def test_constraints_must_be_a_list(engine):
    with pytest.raises(SearchSpaceError, match="'constraints' must be a list"):
        build_space({"constraints": True}, engine, source="prop")


def test_a_prompt_holding_a_unicode_line_separator_is_one_line(tmp_path: Path):
    msg = _jsonl_error(tmp_path, '{"prompt": "a\u2028b\x85c"}\n{oops\n')
    assert "FILE:2 is not valid JSON" in msg  # not line 4: U+2028 and U+0085 don't end lines
