"""Bad input through the real command line: one clear message, exit code 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import autotune


def _assert_clean_error(proc, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in proc.stderr, proc.stderr


@pytest.fixture
def studies(tmp_path: Path) -> Path:
    return tmp_path / "studies"


def _run_new(studies: Path, model: Path, *extra: str):
    """``autotune run`` of a new study ``s`` of ``model`` in ``studies``."""
    return autotune("run", "--model", str(model), "--study", "s", "--studies-dir", str(studies), *extra)


def test_missing_model_path(studies):
    proc = autotune("run", "--model", "/no/such/model", "--study", "s", "--studies-dir", str(studies))
    _assert_clean_error(proc, "--model /no/such/model", "no such directory")
    assert not (studies / "s.db").exists()


def test_unknown_engine_arg(tmp_path, studies, tiny_model):
    space = tmp_path / "s.yaml"
    space.write_text("parameters:\n  swap_space: {type: int, low: 1, high: 8}\n")
    proc = _run_new(studies, tiny_model, "--space", str(space))
    _assert_clean_error(proc, "parameters.swap_space", "not an engine argument")


def test_malformed_yaml(tmp_path, studies, tiny_model):
    space = tmp_path / "s.yaml"
    space.write_text("parameters: [unclosed\n")
    proc = _run_new(studies, tiny_model, "--space", str(space))
    _assert_clean_error(proc, "malformed YAML at line")


def test_empty_workload(tmp_path, studies, tiny_model):
    wl = tmp_path / "empty.jsonl"
    wl.write_text("")
    proc = autotune(
        "run",
        "--model",
        str(tiny_model),
        "--study",
        "s",
        "--studies-dir",
        str(studies),
        "--workload",
        str(wl),
    )
    _assert_clean_error(proc, "no usable prompt")
    assert not (studies / "s.db").exists()


def test_bad_storage_url(tiny_model):
    proc = autotune("run", "--model", str(tiny_model), "--study", "s", "--storage", "redis://localhost/1")
    _assert_clean_error(proc, "--storage", "unsupported scheme 'redis'")


def test_bad_study_name(tiny_model):
    proc = autotune("run", "--model", str(tiny_model), "--study", "../escape")
    _assert_clean_error(proc, "--study '../escape'")


def test_zero_trials():
    proc = autotune("run", "--study", "s", "--trials", "0")
    assert proc.returncode == 2 and "must be at least 1" in proc.stderr


def test_export_of_missing_study(studies):
    proc = autotune("export", "--study", "nope", "--studies-dir", str(studies), "--out", "x.json")
    _assert_clean_error(proc, "no study 'nope'")


def test_resume_of_missing_study_needs_model(studies):
    proc = autotune("run", "--study", "nope", "--studies-dir", str(studies), "--trials", "1")
    _assert_clean_error(proc, "does not exist yet; give --model")


def test_enqueue_of_a_long_inline_config_is_parsed_not_taken_for_a_path(studies):
    # 280 characters: longer than a file name may be (it used to crash in Path.is_file)
    long_cfg = json.dumps({"max_num_seqs": 128, "comment": "x" * 260})
    proc = autotune("run", "--study", "s", "--studies-dir", str(studies), "--enqueue", long_cfg)
    _assert_clean_error(proc, "study 's'")  # got past --enqueue, stopped at the missing study


def test_enqueue_of_a_missing_file(studies):
    proc = autotune("run", "--study", "s", "--studies-dir", str(studies), "--enqueue", "seed.json")
    _assert_clean_error(proc, "--enqueue 'seed.json'", "not a readable file", "No such file")


def test_constraints_that_rule_out_the_whole_space(tmp_path, studies, tiny_model):
    space = tmp_path / "s.yaml"
    space.write_text(
        "parameters:\n  max_num_seqs: {type: int, low: 1, high: 256}\nconstraints:\n  - max_num_seqs > 1000\n"
    )
    proc = _run_new(studies, tiny_model, "--space", str(space))
    _assert_clean_error(proc, "constraints rule out all 300 configs", "'max_num_seqs > 1000'", "loosen")
    assert not studies.exists()  # nothing written, not even the studies directory


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--gpus", "0,1"], "runs on the CPU"),
        (["--gpus", "0,zero"], "'zero' is not a GPU index"),
        (["--gpus-per-trial", "0"], "must be at least 1"),
        (["--heartbeat", "-5"], "must be at least 1"),
    ],
)
def test_bad_gpu_and_heartbeat_flags(studies, tiny_model, flags, needle):
    proc = _run_new(studies, tiny_model, *flags)
    _assert_clean_error(proc, needle)
    assert not studies.exists()


def test_export_of_a_study_without_a_finished_trial(tmp_path):
    import optuna

    from autotune.study.settings import SETTINGS_ATTR, StudySettings

    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}")
    study.set_user_attr(SETTINGS_ATTR, StudySettings(model="m", workload={}, space={}).to_dict())
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)
    out = tmp_path / "best.json"
    proc = autotune("export", "--study", "s", "--studies-dir", str(tmp_path), "--out", str(out))
    _assert_clean_error(proc, "has no completed trial to export yet", "autotune run --study s")
    assert not out.exists()
