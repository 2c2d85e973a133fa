from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.errors import WorkloadError
from autotune.trial.workload import load_requests, parse_workload


def test_synthetic_spec():
    wl = parse_workload("synthetic:count=10,input_len=32,output_len=8,prefix_len=16,seed=3")
    assert (wl.kind, wl.count, wl.input_len, wl.output_len, wl.prefix_len, wl.seed) == (
        "synthetic",
        10,
        32,
        8,
        16,
        3,
    )
    assert load_requests(wl) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty"),
        ("poisson:count=3", "unknown kind"),
        ("synthetic:count=0", "count must be >= 1"),
        ("synthetic:count=ten", "must be an integer"),
        ("synthetic:lenght=3", "bad option"),
        ("synthetic:input_len=8,prefix_len=8", "prefix_len"),
        ("jsonl:/nonexistent.jsonl", "does not exist"),
        ("jsonl", "give the file"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(WorkloadError, match=message):
        parse_workload(spec)


def test_jsonl(tmp_path: Path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        '{"prompt": "hello there", "output_len": 7}\n\n"plain string"\n{"prompt_token_ids": [5, 6]}\n'
    )
    reqs = load_requests(parse_workload(str(f)))
    assert reqs == [
        {"prompt": "hello there", "output_len": 7},
        {"prompt": "plain string"},
        {"prompt_token_ids": [5, 6]},
    ]
    fixed = load_requests(parse_workload(f"jsonl:{f},output_len=3,count=2"))
    assert len(fixed) == 2 and all(r["output_len"] == 3 for r in fixed)


def test_jsonl_bad_line_reports_line_number(tmp_path: Path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{"prompt": "broken"\n')
    with pytest.raises(WorkloadError, match=r"p\.jsonl:2 is not valid JSON"):
        load_requests(parse_workload(str(f)))
    f.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(WorkloadError, match=r"p\.jsonl:2 needs"):
        load_requests(parse_workload(str(f)))


def test_empty_files(tmp_path: Path):
    f = tmp_path / "e.jsonl"
    f.write_text("\n\n")
    with pytest.raises(WorkloadError, match="no usable prompt"):
        load_requests(parse_workload(str(f)))
    g = tmp_path / "e.json"
    g.write_text("[]")
    with pytest.raises(WorkloadError, match="no usable prompt"):
        load_requests(parse_workload(str(g)))


def test_sharegpt(tmp_path: Path):
    data = [
        {"id": "a", "conversations": [{"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "Q2"}]},  # no reply: skipped
        {"id": "c", "conversations": [{"from": "human", "value": "Q3"}, {"from": "gpt", "value": "A3"}]},
    ]
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(data))
    reqs = load_requests(parse_workload(f"sharegpt:{f}"))
    assert reqs == [{"prompt": "Q1", "completion": "A1"}, {"prompt": "Q3", "completion": "A3"}]
    sampled = load_requests(parse_workload(f"sharegpt:{f},count=1,seed=5"))
    assert sampled == load_requests(parse_workload(f"sharegpt:{f},count=1,seed=5"))  # seeded
    f.write_text("{not json")
    with pytest.raises(WorkloadError, match="not valid JSON"):
        load_requests(parse_workload(f"sharegpt:{f}"))


def test_huge_workloads_are_refused(tmp_path: Path):
    with pytest.raises(WorkloadError, match="above the limit of 1000000"):
        parse_workload("synthetic:count=1000001")
    path = tmp_path / "huge.jsonl"
    path.write_text('{"prompt": "x"}\n' * 1_000_001)
    with pytest.raises(WorkloadError, match="1000001 prompts, above the limit of 1000000; pass count=N"):
        load_requests(parse_workload(f"jsonl:{path}"))
    assert len(load_requests(parse_workload(f"jsonl:{path},count=1000"))) == 1000  # the fix it names
