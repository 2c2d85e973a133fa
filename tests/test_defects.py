"""Defects found by reading the code as a newcomer would (issue 15), each pinned by a test."""

from __future__ import annotations

import json
import pkgutil
import sys
from pathlib import Path

import pytest

import autotune
from autotune.errors import EngineError
from autotune.trial.outcome import classify
from autotune.trial.record import Outcome, TrialRecord
from tests.helpers import autotune as run_cli
from tests.synthetic import make_study

# -- outcome classification reads the error, not whole logs -------------------------------------

#: lines vLLM and PyTorch print in healthy runs, shaped like the patterns of a real failure
HARMLESS_LOG = """\
INFO 12-04 15:00:01 [platform.py:120] FlashInfer is not supported on this platform, using TORCH_SDPA
WARNING 12-04 15:00:02 [cpu.py:88] Pin memory is not supported by the CPU backend.
(EngineCore_DP0 pid=4242) WARNING 12-04 15:00:03 [utils.py:51] Cannot allocate memory for the \
pinned staging buffer; falling back to pageable memory
(EngineCore_DP0 pid=4242) INFO 12-04 15:00:04 [gpu_model_runner.py:3021] no OutOfMemoryError \
seen while profiling: 12.5 GiB free
"""


def test_a_crash_whose_log_has_harmless_oom_and_unsupported_lines_is_a_crash():
    stderr = HARMLESS_LOG + (
        "Traceback (most recent call last):\n"
        '  File "/x/worker.py", line 200, in run\n'
        "    llm = LLM(**kwargs)\n"
        "KeyError: 'model.layers.0.mlp.gate_proj.weight'\n"
    )
    events = [{"event": "error", "error_type": "KeyError", "error": "'model.layers.0.mlp.gate_proj.weight'"}]
    outcome, error_type, error, _ = classify(returncode=1, timed_out=False, events=events, stderr_tail=stderr)
    assert (outcome, error_type) == (Outcome.CRASH, "KeyError")
    assert "gate_proj" in (error or "")


def test_the_root_cause_in_an_engine_core_traceback_still_counts():
    # the multiprocess engine: the worker only sees a wrapper, the engine core's traceback has the cause
    stderr = HARMLESS_LOG + (
        "(EngineCore_DP0 pid=4242) Traceback (most recent call last):\n"
        '(EngineCore_DP0 pid=4242)   File "/x/core.py", line 90, in run_engine_core\n'
        "(EngineCore_DP0 pid=4242) ValueError: No available memory for the cache blocks. Try "
        "increasing `gpu_memory_utilization` when initializing the engine\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    events = [{"event": "error", "error_type": "RuntimeError", "error": "Engine core initialization failed."}]
    outcome, error_type, error, _ = classify(returncode=1, timed_out=False, events=events, stderr_tail=stderr)
    assert (outcome, error_type) == (Outcome.OOM, "oom")
    assert (error or "").startswith("ValueError: No available memory for the cache blocks")


def test_an_invalid_config_keeps_its_whole_message():
    # issue 20: show and result.json kept "1 validation error for SchedulerConfig" and lost the cause
    text = (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
        "  Value error, long_prefill_token_threshold (8192) cannot be greater than the "
        "max_model_len (2048). [type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]\n"
        "    For further information visit https://errors.pydantic.dev/2.12/v/value_error\n"
    )
    events = [{"event": "error", "error_type": "invalid_config", "error": text.strip()}]
    outcome, _, error, _ = classify(returncode=3, timed_out=False, events=events, stderr_tail=text)
    assert outcome is Outcome.INVALID
    assert "long_prefill_token_threshold (8192) cannot be greater than the max_model_len (2048)" in (
        error or ""
    )


# -- a module named like the standard library's -----------------------------------------------


def test_no_module_shadows_the_standard_library():
    names = [m.name for m in pkgutil.walk_packages(autotune.__path__)]
    assert names, "walk_packages found nothing"
    shadowing = sorted(n for n in names if n in sys.stdlib_module_names)
    assert not shadowing, f"autotune/ on sys.path would shadow the standard library: {shadowing}"


# -- describe: a hung child is an error, not a traceback -----------------------------------------


def test_a_describe_that_does_not_answer_is_a_clear_error():
    from autotune.space.engine_args import describe_engine

    with pytest.raises(EngineError, match=r"did not answer within 0\.01 s"):
        describe_engine(use_cache=False, timeout_s=0.01)


# -- export: no completed trial is said before any importance work -----------------------------


def test_export_without_a_completed_trial_says_so_before_ranking(tmp_path: Path):
    import optuna

    from autotune.study.settings import SETTINGS_ATTR

    study = optuna.create_study(
        study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize"
    )
    study.set_user_attr(SETTINGS_ATTR, make_study(n=0).user_attrs[SETTINGS_ATTR])
    study.add_trial(
        optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={"outcome": "oom"})
    )
    proc = run_cli(
        "export", "--study", "s", "--studies-dir", str(tmp_path), "--out", str(tmp_path / "b.json")
    )
    assert proc.returncode == 2, proc.stderr
    assert "has no completed trial to export yet" in proc.stderr
    assert "importance" not in proc.stdout.lower() and not proc.stdout.strip()
    assert not (tmp_path / "b.json").exists()


# -- a bad --set or an infeasible space leaves nothing behind -------------------------------------


def test_a_set_that_makes_the_default_space_infeasible_creates_no_study(tmp_path: Path, tiny_model: Path):
    studies = tmp_path / "studies"
    # every space searches max_num_seqs >= 1: no batch of 0 tokens keeps vLLM's rule
    # max_num_batched_tokens >= max_num_seqs, so the --set rules out every config
    proc = run_cli(
        "run", "--model", str(tiny_model), "--study", "s", "--studies-dir", str(studies),
        "--space", "cpu", "--set", "max_num_batched_tokens=0",
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "rule out all" in proc.stderr
    proc = run_cli(
        "run", "--model", str(tiny_model), "--study", "s", "--studies-dir", str(studies),
        "--set", "max_num_batched_tokens=0",
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "rule out all" in proc.stderr
    assert not studies.exists() or not any(studies.iterdir()), list(studies.iterdir())


def test_a_misspelt_set_names_set_and_creates_nothing(tmp_path: Path, tiny_model: Path):
    studies = tmp_path / "studies"
    proc = run_cli(
        "run", "--model", str(tiny_model), "--study", "bad8", "--studies-dir", str(studies),
        "--set", "max_num_seq=4",
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--set max_num_seq" in proc.stderr and "did you mean max_num_seqs" in proc.stderr
    assert "throughput.yaml" not in proc.stderr
    assert not (studies / "bad8.db").exists() and not (studies / "bad8.lock").exists()


# -- the bundled spaces travel with the package -----------------------------------------------------


def test_the_bundled_spaces_are_package_data():
    from importlib import resources

    from autotune.space.load import bundled_spaces

    spaces = bundled_spaces()
    assert {"throughput", "cpu"} <= set(spaces)
    root = resources.files("autotune.space") / "spaces"
    assert (root / "throughput.yaml").is_file()
    assert json.dumps(sorted(spaces))  # names, not paths of a checkout


# -- a trial's record never comes from another trial -------------------------------------------


def test_a_trial_dir_holding_an_earlier_trials_files_is_moved_aside(tmp_path: Path):
    from autotune.trial.runner import claim_dir

    tdir = tmp_path / "trials" / "0"
    tdir.mkdir(parents=True)
    (tdir / "stdout.log").write_text('@@autotune {"event": "result", "pid": 1, "metrics": {}}\n')
    claim_dir(tdir)
    assert tdir.is_dir() and not any(tdir.iterdir())
    (aside,) = [p for p in tdir.parent.iterdir() if p.name.startswith("0.stale-")]
    assert (aside / "stdout.log").is_file()  # nothing is lost
    claim_dir(tdir)  # an empty dir is this trial's already
    assert len(list(tdir.parent.iterdir())) == 2


def test_the_parser_reads_only_its_own_process_events():
    from autotune.trial import protocol

    lines = [
        '@@autotune {"event": "result", "pid": 111, "metrics": {"num_requests": 64}}',
        "INFO vLLM says hello",
        '@@autotune {"event": "result", "pid": 222, "metrics": {"num_requests": 256}}',
    ]
    (event,) = protocol.parse(lines, pid=222)
    assert event["metrics"]["num_requests"] == 256


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_recreated_study_measures_its_own_workload(tmp_path: Path, tiny_model: Path):
    """Issue 15, seen as a user: a study deleted and created again under its name printed the
    first study's figure for its trial #0 (the trial dir was reused, its logs appended to)."""
    studies = tmp_path / "studies"
    common = ["--model", str(tiny_model), "--study", "s", "--studies-dir", str(studies), "--space", "cpu"]
    common += ["--trials", "1", "--no-bar", "--trial-timeout", "300"]
    first = run_cli("run", *common, "--workload", "synthetic:count=16,input_len=16,output_len=8")
    assert first.returncode == 0, first.stderr[-3000:]
    (studies / "s.db").unlink()
    second = run_cli("run", *common, "--workload", "synthetic:count=48,input_len=16,output_len=16")
    assert second.returncode == 0, second.stderr[-3000:]
    result = TrialRecord.read_json(studies / "s" / "trials" / "0" / "result.json")
    assert result.outcome is Outcome.SUCCESS
    assert result.metrics["num_requests"] == 48 and result.metrics["output_tokens"] == 48 * 16
    assert "moved them to" in second.stderr
    (aside,) = (studies / "s" / "trials").glob("0.stale-*")
    assert json.loads((aside / "result.json").read_text())["metrics"]["num_requests"] == 16


def test_one_record_for_the_study_and_result_json(tmp_path: Path):
    from autotune.trial.record import Role

    record = TrialRecord(
        outcome=Outcome.SUCCESS,
        metrics={"output_tokens_per_s": 10.0},
        telemetry={"available": False},
        wall_s=3.0,
        phases_s={"generate": 1.0},
        engine_kwargs={"model": "m"},
        role=Role.BASELINE,
        retry_of=0,
        returncode=0,
        pid=42,
    )
    attrs = record.attrs()
    assert attrs["autotune_role"] == "baseline" and attrs["autotune_retry_of"] == 0
    assert attrs["metrics"]["telemetry"] == {"available": False}  # where studies always kept it
    assert "pid" not in attrs and "returncode" not in attrs  # the process's, result.json only
    assert TrialRecord.from_attrs(attrs) == TrialRecord(
        **{**record.__dict__, "returncode": None, "pid": None}
    )
    record.write_json(tmp_path / "result.json")
    on_disk = json.loads((tmp_path / "result.json").read_text())
    assert on_disk["pid"] == 42 and "autotune_role" not in on_disk and "role" not in on_disk
    assert TrialRecord.read_json(tmp_path / "result.json").metrics == record.metrics
