"""What got in a newcomer's way in their first hour (issue 20), each pinned by a test."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.space.load import load_space
from tests.helpers import autotune


def test_the_default_space_is_the_platforms(engine):
    space = load_space(None, engine)
    assert space.name == ("cpu" if engine.platform == "cpu" else "throughput")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_failed_baseline_ends_the_run_loudly_and_a_resume_says_why(tmp_path: Path, tiny_model: Path):
    # 256 KiB of KV cache for every trial: vLLM's defaults cannot hold one max-length sequence
    studies = tmp_path / "studies"
    common = ["--study", "s", "--studies-dir", str(studies), "--no-bar", "--trial-timeout", "300"]
    first = autotune(
        "run", "--model", str(tiny_model), "--trials", "4", "--set", "kv_cache_memory_bytes=262144",
        "--workload", "synthetic:count=8,input_len=16,output_len=8", *common,
    )  # fmt: skip
    assert first.returncode == 2 and "Traceback" not in first.stderr, first.stderr[-3000:]
    assert "the baseline (trial #0" in first.stderr and "[oom]" in first.stderr
    assert "larger than the available KV cache memory" in first.stderr
    assert "start a new --study" in first.stderr
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{studies}/s.db").trials
    assert len(trials) == 1  # nothing ran after it: every other config would be compared with nothing
    again = autotune("run", *common)
    assert again.returncode == 2 and "the baseline (trial #0" in again.stderr, again.stderr[-3000:]
    assert len(optuna.load_study(study_name="s", storage=f"sqlite:///{studies}/s.db").trials) == 1
    assert json.loads((studies / "s" / "trials" / "0" / "result.json").read_text())["outcome"] == "oom"


@pytest.mark.parametrize("name", ["cpu", "throughput"])
def test_every_bundled_space_holds_vllms_defaults_strictly_inside(engine, name):
    from autotune.space.load import defaults_outside

    # on a GPU box tensor_parallel_size is searched from 1, its default and its floor
    assert defaults_outside(load_space(name, engine, gpus=4), engine) == []


def test_a_range_that_tops_out_at_the_default_says_which_bound_to_widen(engine, tmp_path: Path):
    from autotune.space.load import build_space, defaults_outside

    seqs = engine.default("max_num_seqs")
    assert isinstance(seqs, int)  # resolved for this machine by the --describe worker
    raw = {"parameters": {"max_num_seqs": {"type": "int", "low": 1, "high": seqs, "log": True}}}
    (message,) = defaults_outside(build_space(raw, engine, source="my.yaml"), engine, source="my.yaml")
    assert "parameters.max_num_seqs" in message and f"widen 'high' above {seqs}" in message


def test_a_smaller_trials_never_lowers_the_budget_silently(tmp_path: Path):
    from autotune.study.budget import counted_trials
    from autotune.study.settings import budget
    from tests.synthetic import make_study

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = make_study(url, n=12, name="s")
    used = counted_trials(study)
    assert budget(study) == 30 and used < 30
    common = ["--study", "s", "--studies-dir", str(tmp_path), "--no-bar", "--validate-rounds", "0"]
    below = autotune("run", "--trials", "3", *common)
    assert below.returncode == 0, below.stderr[-2000:]
    assert f"has used {used} already: nothing more runs, and its budget stays at 30" in below.stderr
    assert budget(optuna.load_study(study_name="s", storage=url)) == 30
    lower = autotune("run", "--trials", str(used), *common)  # lowered to what is used: nothing runs
    assert lower.returncode == 0, lower.stderr[-2000:]
    assert f"lowering the budget of study 's' from 30 to {used}" in lower.stderr
    assert budget(optuna.load_study(study_name="s", storage=url)) == used
    assert f"{used}/{used}" in autotune("ls", "--studies-dir", str(tmp_path)).stdout
    assert f"budget       {used} trials, {used} used" in autotune("show", *common[:4]).stdout


def test_a_jsonl_workload_says_its_real_output_length():
    from autotune.trial.workload import WorkloadSpec

    text = WorkloadSpec(kind="jsonl", path="p.jsonl", count=None, output_len=None).describe()
    assert "256" in text and "reply" not in text
    assert (
        "each reply's length"
        in WorkloadSpec(kind="sharegpt", path="c.json", count=None, output_len=None).describe()
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_outputs_shortened_to_fit_max_model_len_are_said(tmp_path: Path, tiny_model: Path):
    prompts = tmp_path / "p.jsonl"
    words = "the scheduler packs many requests into each batch so the accelerator stays busy " * 6
    prompts.write_text("".join(json.dumps({"prompt": f"{i} {words}"}) + "\n" for i in range(6)))
    proc = autotune(
        "run", "--model", str(tiny_model), "--study", "s", "--studies-dir", str(tmp_path / "studies"),
        "--workload", f"jsonl:{prompts},output_len=100", "--set", "max_model_len=160", "--trials", "1",
        "--no-bar", "--trial-timeout", "300",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "6 of 6 requests were shortened to fit max_model_len=160" in proc.stderr, proc.stderr[-3000:]
    assert "of 600 requested output tokens are generated" in proc.stderr


def test_an_invalid_configs_cause_is_what_show_says():
    from autotune.trial.outcome import error_summary

    error = (
        "ValidationError: 1 validation error for SchedulerConfig\n  Value error, "
        "long_prefill_token_threshold (8192) cannot be greater than the max_model_len (2048). "
        "[type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]"
    )
    assert error_summary(error) == (
        "SchedulerConfig: long_prefill_token_threshold (8192) cannot be greater than the "
        "max_model_len (2048)."
    )


def test_values_that_can_only_be_invalid_for_the_model_are_not_searched(engine, tiny_model: Path):
    from autotune.space.constraints import bound_by_context
    from autotune.space.load import build_space
    from autotune.trial.model_ref import context_length

    assert context_length(str(tiny_model)) == 2048  # the tiny Llama's max_position_embeddings
    raw = {
        "parameters": {
            "long_prefill_token_threshold": {"type": "categorical", "choices": [0, 512, 2048, 8192]}
        }
    }
    space, notes = bound_by_context(build_space(raw, engine), context_length(str(tiny_model)))
    assert space.parameters[0].choices == (0, 512, 2048)
    assert notes == ["long_prefill_token_threshold: [8192] dropped, above max_model_len (2048)"]
    fixed = build_space({**raw, "fixed": {"max_model_len": 1024}}, engine)
    assert bound_by_context(fixed, 2048)[0].parameters[0].choices == (0, 512)  # the fixed one wins


def test_a_run_ends_with_what_was_found_and_what_to_do_next():
    from autotune.output.summary import format_summary

    found = {
        "study": "s",
        "objective": "output_tokens_per_s",
        "trials": {"COMPLETE": 5, "PRUNED": 1},
        "best": {"trial": 3, "value": 1200.0},
        "baseline_trial": 0,
        "baseline_value": 1000.0,
        "speedup_over_baseline": 1.2,
    }
    text = format_summary(found, " --studies-dir runs")
    assert "x1.200 over vLLM's defaults" in text
    assert "next: autotune export --study s --studies-dir runs --out best.json" in text
    same = format_summary({**found, "best": {"trial": 0, "value": 1000.0}, "speedup_over_baseline": 1.0})
    assert "nothing beat vLLM's defaults" in same and "x1.000" not in same


def test_help_describes_each_command_with_an_example():
    commands = ("run", "demo", "ls", "show", "importance", "report", "export")
    for command in commands:
        out = autotune(command, "--help").stdout
        assert "example:" in out and f"autotune {command}" in out, command
    run = " ".join(autotune("run", "--help").stdout.split())
    assert "jsonl:FILE" in run and "sharegpt:FILE" in run  # the workload kinds
    assert "cpu, cpu-real, throughput" in run  # the bundled spaces
    assert "(default 1800;" in run  # --trial-timeout's default
    assert "name of the study to read" in " ".join(autotune("show", "--help").stdout.split())
    demo = " ".join(autotune("demo", "--help").stdout.split())
    assert "--studies-dir STUDIES_DIR home of the study" in demo and "--space SPACE search space" in demo
    bad = autotune("show", "--study", "nope", "--studies-dir", "/nonexistent", "--debug")
    assert bad.returncode == 2 and "Traceback" in bad.stderr  # --debug after the command works


def test_the_bar_shows_the_running_trials_phase_and_its_own_eta(monkeypatch):
    from autotune.tuning.progress import Progress

    clock = [1000.0]
    monkeypatch.setattr("autotune.tuning.progress.time.time", lambda: clock[0])
    progress = Progress(budget=4, objective="x", show_bar=True)
    try:
        progress.phase(0, "engine_start")
        clock[0] += 12
        progress._redraw()
        assert "#0 engine_start 12s" in progress._bar.postfix
        assert "{rate" not in progress._bar.bar_format and "remaining" not in progress._bar.bar_format

        study = optuna.create_study(direction="maximize")

        def objective(trial: optuna.Trial) -> float:
            trial.set_user_attr("wall_s", 60.0)
            return 1.0

        study.optimize(objective, n_trials=1, callbacks=[progress])
        assert "engine_start" not in progress._bar.postfix  # it ended
        assert "ETA 3m00s" in progress._bar.postfix  # 3 trials left x a 60 s median, not tqdm's rate
    finally:
        progress.close()
