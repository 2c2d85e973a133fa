"""Multi-GPU pinning without GPUs: how --gpus splits into slots, and what each trial process is given."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import optuna
import pytest

from autotune.errors import PlacementError
from autotune.space.load import build_space
from autotune.study.settings import StudySettings
from autotune.trial.record import Outcome, TrialRecord
from autotune.trial.runner import TrialSpec
from autotune.tuning.objective import Objective
from autotune.tuning.placement import PORT_BASE, PORT_STRIDE, SlotPool, parse_gpus, plan_slots
from tests.helpers import fake_trials, objective_for

EIGHT = list(range(8))


def test_parse_gpus_lists_and_ranges():
    assert parse_gpus("0,1,2,3") == [0, 1, 2, 3]
    assert parse_gpus("0-3") == [0, 1, 2, 3]
    assert parse_gpus("4, 6-7") == [4, 6, 7]


@pytest.mark.parametrize(
    ("text", "needle"), [("0,x", "'x' is not a GPU index"), ("1,1", "listed twice"), ("3-1", "empty")]
)
def test_parse_gpus_rejects_bad_lists(text, needle):
    with pytest.raises(PlacementError, match=needle):
        parse_gpus(text)


def test_one_gpu_per_trial_gives_each_trial_its_own_gpu_and_ports():
    slots = plan_slots([0, 1, 2, 3, 4, 5, 6, 7], 1, visible=EIGHT, platform="cuda")
    assert [s.device_ids for s in slots] == [(i,) for i in range(8)]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == [str(i) for i in range(8)]
    assert all(s.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for s in slots)  # = NVML's order
    ports = [int(s.env["VLLM_PORT"]) for s in slots]
    assert ports == [PORT_BASE + i * PORT_STRIDE for i in range(8)]


def test_tensor_parallel_groups_of_two():
    slots = plan_slots([4, 5, 6, 7], 2, visible=EIGHT, platform="cuda")
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["4,5", "6,7"]
    assert SlotPool(slots).gpus_per_trial == 2


def test_defaults_keep_one_unpinned_trial_on_every_visible_gpu():
    (slot,) = plan_slots(None, None, visible=[0, 1], platform="cuda")
    assert slot.device_ids == (0, 1) and slot.env == {}  # the process's own CUDA_VISIBLE_DEVICES rules
    assert plan_slots(None, 1, visible=[2, 3], platform="cuda")[1].env["CUDA_VISIBLE_DEVICES"] == "3"
    assert plan_slots(None, None, visible=[], platform="cpu")[0].device_ids == ()


@pytest.mark.parametrize(
    ("gpus", "per", "visible", "platform", "needle"),
    [
        ([0, 1, 2], 2, EIGHT, "cuda", "don't split into groups of 2"),
        ([0, 1], 4, EIGHT, "cuda", "don't split into groups of 4"),
        ([0, 9], 1, EIGHT, "cuda", r"GPU\(s\) \[9\] are not visible"),
        ([0, 1], 1, [], "cpu", "runs on the CPU"),
        (None, 1, [], "cuda", "NVML sees no GPU"),
    ],
)
def test_unusable_splits_are_clear_errors(gpus, per, visible, platform, needle):
    with pytest.raises(PlacementError, match=needle):
        plan_slots(gpus, per, visible=visible, platform=platform)


def _space(engine, tp_high: int):
    raw = {
        "name": "t",
        "parameters": {
            # wide, so that sampled configs don't repeat (a repeat is answered, not run)
            "max_num_seqs": {"type": "int", "low": 1, "high": 1_000_000},
            "tensor_parallel_size": {"type": "categorical", "choices": [1, 2, 4][: tp_high.bit_length()]},
        },
    }
    return build_space(raw, engine, source="test", gpus=tp_high)


def test_parallel_trials_each_get_a_slot_of_their_own(engine, tmp_path: Path, monkeypatch):
    """Four slots, eight trials in Optuna's threads: no two running trials ever share a GPU, and
    each trial process is given exactly its slot's CUDA_VISIBLE_DEVICES and ports."""
    specs: list[TrialSpec] = []
    running: set[str] = set()
    overlaps: list[str] = []
    lock = threading.Lock()

    def fake_run_trial(spec: TrialSpec, **_: object) -> TrialRecord:
        gpus = spec.env["CUDA_VISIBLE_DEVICES"]
        with lock:
            if gpus in running:
                overlaps.append(gpus)
            running.add(gpus)
            specs.append(spec)
        time.sleep(0.05)
        with lock:
            running.discard(gpus)
        return TrialRecord(outcome=Outcome.SUCCESS, metrics={"output_tokens_per_s": 1.0})

    monkeypatch.setattr("autotune.tuning.measure.run_trial", fake_run_trial)
    slots = plan_slots([0, 1, 2, 3], 1, visible=EIGHT, platform="cuda")
    objective = Objective(
        settings=StudySettings(
            model="m", workload={"kind": "synthetic"}, space={}, objective="output_tokens_per_s"
        ),
        space=_space(engine, 1),
        study_dir=tmp_path,
        timeout_s=60,
        pool=SlotPool(slots),
        env={"HF_HUB_OFFLINE": "1"},
    )
    study = optuna.create_study(direction="maximize")
    study.optimize(objective, n_trials=8, n_jobs=len(slots))

    assert len(specs) == 8 and not overlaps
    assert {s.env["CUDA_VISIBLE_DEVICES"] for s in specs} <= {"0", "1", "2", "3"}
    for s in specs:
        slot = next(x for x in slots if x.env["CUDA_VISIBLE_DEVICES"] == s.env["CUDA_VISIBLE_DEVICES"])
        assert s.device_ids == list(slot.device_ids)  # NVML telemetry watches the same GPU
        assert s.env["VLLM_PORT"] == slot.env["VLLM_PORT"] and s.env["HF_HUB_OFFLINE"] == "1"
    assert {t.user_attrs["gpus"][0] for t in study.trials} <= {0, 1, 2, 3}


def test_tensor_parallel_size_is_bounded_by_gpus_per_trial(engine, tmp_path: Path, monkeypatch):
    ran = fake_trials(monkeypatch)
    space = _space(engine, 4)  # a space written for 4 GPUs
    pool = SlotPool(plan_slots([0, 1, 2, 3], 2, visible=EIGHT, platform="cuda"))
    objective = objective_for(space, tmp_path, pool=pool)
    study = optuna.create_study(direction="maximize")
    for tp in (1, 2, 4):
        study.enqueue_trial({"max_num_seqs": 64, "tensor_parallel_size": tp})
    study.optimize(objective, n_trials=3)
    assert [spec.engine_kwargs["tensor_parallel_size"] for spec in ran] == [1, 2]
    skipped = study.trials[2]
    assert skipped.state == optuna.trial.TrialState.PRUNED
    assert "exceeds the 2 GPU(s) a trial may use" in skipped.user_attrs["error"]
