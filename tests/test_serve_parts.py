"""Serve mode's parts that need no engine: SLOs, the options' checks, the config as server flags
and YAML, the benchmark client's arguments, and how a missed SLO keeps a trial from winning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.errors import ServeError
from autotune.space.engine_args import EngineInfo
from autotune.space.flags import serve_args, serve_config
from autotune.study.slo import METRICS, misses, parse_slos, set_constraints
from autotune.study.trials import best_or_none
from autotune.study.validation import top_configs
from autotune.trial.record import TrialRecord
from autotune.trial.serve_worker import bench_args, dataset_args, free_port, metrics_of
from autotune.tuning.inputs import check_serve
from autotune.tuning.request import RunRequest


def test_slos_parse_and_bad_ones_name_the_fix():
    assert parse_slos("ttft_p99_ms=500, tpot_p99_ms=50") == {"ttft_p99_ms": 500.0, "tpot_p99_ms": 50.0}
    assert "e2el_mean_ms" in METRICS and "itl_p90_ms" in METRICS
    for bad, words in (
        ("ttft_p95_ms=500", "unknown metric 'ttft_p95_ms'"),
        ("ttft_p99_ms", "METRIC=MILLISECONDS"),
        ("ttft_p99_ms=-1", "positive number"),
        ("ttft_p99_ms=fast", "positive number"),
        ("ttft_p99_ms=1,ttft_p99_ms=2", "given twice"),
        ("", "empty"),
    ):
        with pytest.raises(ServeError, match=words):
            parse_slos(bad)
    assert misses({"ttft_p99_ms": 600.0, "tpot_p99_ms": 10.0}, {"ttft_p99_ms": 500, "tpot_p99_ms": 50}) == {
        "ttft_p99_ms": 600.0
    }


def test_serve_options_go_together():
    with pytest.raises(ServeError, match="add --mode serve"):
        check_serve(RunRequest(study="s", concurrency=8))
    with pytest.raises(ServeError, match="--concurrency N"):
        check_serve(RunRequest(study="s", mode="serve"))
    with pytest.raises(ServeError, match="give one of them"):
        check_serve(RunRequest(study="s", mode="serve", concurrency=8, request_rate=4.0))
    check_serve(RunRequest(study="s", mode="serve", request_rate=4.0))
    check_serve(RunRequest(study="s"))
    # a resume may repeat its options, or name them alone: the session compares them with the stored
    check_serve(RunRequest(study="s", concurrency=8), new=False)
    check_serve(RunRequest(study="s", mode="serve"), new=False)


def test_the_cli_refuses_a_bad_slo_in_one_line(tmp_path: Path):
    from tests.helpers import autotune

    out = autotune(
        "run", "--study", "x", "--studies-dir", str(tmp_path), "--mode", "serve", "--slo", "ttft=5"
    )
    assert out.returncode == 2
    assert "unknown metric 'ttft'" in out.stderr and "Traceback" not in out.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_the_config_as_vllms_own_parser_reads_it_from_flags_and_from_yaml(engine: EngineInfo, tmp_path: Path):
    """What a trial's server is started with and what the export writes are both read back by the
    installed vLLM's own server parser into the same engine args."""
    kwargs = {"model": "m", "max_num_seqs": 64, "enable_prefix_caching": False, "block_size": 32}
    config = serve_config(kwargs, engine)
    assert "model" not in config and config["max-num-seqs"] == 64
    path = tmp_path / "best.yaml"
    path.write_text(yaml.safe_dump(config))
    code = (
        "import json, sys\n"
        "try:\n"
        "    from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "except ImportError:\n"
        "    from vllm.entrypoints.openai.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "p = make_arg_parser(FlexibleArgumentParser())\n"
        "out = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    ns = p.parse_args(argv)\n"
        "    out.append([ns.model, ns.max_num_seqs, ns.enable_prefix_caching, ns.block_size])\n"
        "print(json.dumps(out))\n"
    )
    argvs = [["--model", "m", *serve_args(kwargs, engine)], ["--model", "m", "--config", str(path)]]
    res = subprocess.run(
        [sys.executable, "-c", code, json.dumps(argvs)], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    flags, from_yaml = json.loads(res.stdout.strip().splitlines()[-1])
    assert flags == from_yaml == ["m", 64, False, 32]


def test_benchmark_arguments_follow_the_workload_and_the_load(tmp_path: Path, tiny_model: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    spec = {
        "trial_dir": str(tmp_path),
        "engine_kwargs": {"model": "m"},
        "workload": {
            "kind": "synthetic",
            "count": 10,
            "input_len": 64,
            "output_len": 8,
            "prefix_len": 16,
            "seed": 3,
        },
        "serve": {"concurrency": 4},
        "sampling": {"temperature": 0.0, "top_p": 1.0},
    }
    args, fit = dataset_args(spec, tokenizer, 1024)
    assert fit == {"requested_output_tokens": 80, "shortened_requests": 0}
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    # vLLM's random dataset puts the prefix before input_len tokens: the workload's includes it
    assert pairs["--random-input-len"] == "48" and pairs["--random-prefix-len"] == "16"
    assert pairs["--random-range-ratio"] == "0" and pairs["--seed"] == "3"
    # outputs that would pass max_model_len are shortened, as offline, and counted
    args, fit = dataset_args(spec, tokenizer, 68)
    assert args[args.index("--random-output-len") + 1] == "4" and fit["shortened_requests"] == 10
    bench = bench_args(spec, "http://127.0.0.1:1", "m", "m")
    assert (
        bench[bench.index("--max-concurrency") + 1] == "4"
        and bench[bench.index("--request-rate") + 1] == "inf"
    )
    assert "--ignore-eos" in bench and bench[bench.index("--temperature") + 1] == "0.0"
    spec["serve"] = {"request_rate": 2.5}
    bench = bench_args(spec, "http://127.0.0.1:1", "m", "m")
    assert bench[bench.index("--request-rate") + 1] == "2.5" and "--max-concurrency" not in bench

    requests = tmp_path / "requests.jsonl"
    lines = [{"prompt": "hi there", "output_len": 5}, {"prompt_token_ids": [5, 6, 7]}]
    requests.write_text("".join(json.dumps(r) + "\n" for r in lines))
    spec["workload"] = {"kind": "jsonl", "count": None, "output_len": None, "seed": 0, "path": "x"}
    spec["requests_file"] = str(requests)
    args, fit = dataset_args(spec, tokenizer, 1024)
    rows = [json.loads(line) for line in (tmp_path / "serve_requests.jsonl").read_text().splitlines()]
    assert rows[0] == {"prompt": "hi there", "output_tokens": 5}
    assert rows[1] == {"prompt": tokenizer.decode([5, 6, 7]), "output_tokens": 256}  # token ids sent as text
    assert fit["requested_output_tokens"] == 261 and "--skip-chat-template" in args
    assert args[args.index("--custom-output-len") + 1] == "-1"


def test_metrics_from_vllms_benchmark_result():
    result = {
        "duration": 2.0,
        "completed": 10,
        "failed": 0,
        "total_input_tokens": 640,
        "total_output_tokens": 80,
        "request_throughput": 5.0,
        "output_throughput": 40.0,
        "total_token_throughput": 360.0,
        "mean_ttft_ms": 12.0,
        "p99_ttft_ms": 30.0,
        "p50_tpot_ms": 2.0,
    }
    m = metrics_of(result)
    assert m["output_tokens_per_s"] == 40.0 and m["requests_per_s"] == 5.0 and m["generate_s"] == 2.0
    assert m["ttft_mean_ms"] == 12.0 and m["ttft_p99_ms"] == 30.0 and m["tpot_p50_ms"] == 2.0
    assert set(METRICS) <= set(m)


def test_free_port_skips_a_taken_one():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        assert free_port(taken) != taken


def test_a_config_that_misses_an_slo_never_wins_nor_is_validated():
    study = optuna.create_study(direction="maximize")
    slos = {"ttft_p99_ms": 500.0}
    for value, ttft, n in ((100.0, 200.0, 1), (300.0, 900.0, 2), (200.0, 400.0, 3)):

        def objective(trial: optuna.Trial, value=value, ttft=ttft, n=n) -> float:
            TrialRecord(engine_kwargs={"model": "m", "max_num_seqs": n}, metrics={"ttft_p99_ms": ttft}).write(
                trial
            )
            set_constraints(trial, {"ttft_p99_ms": ttft}, slos)
            return value

        study.optimize(objective, n_trials=1)
    fastest_but_late = study.trials[1]
    assert fastest_but_late.constraints == {"ttft_p99_ms": 400.0}
    best = best_or_none(study)
    assert best is not None and best.number == 2
    assert [t.number for t in top_configs(study, 3)] == [2, 0]


def test_objectives_parse_with_aliases_and_refuse_what_cannot_be_measured():
    from autotune.errors import StudyError
    from autotune.study.objectives import direction, parse_objectives

    assert parse_objectives("throughput,ttft_p99", serve=True) == ["output_tokens_per_s", "ttft_p99_ms"]
    assert [direction(n) for n in ("output_tokens_per_s", "ttft_p99_ms")] == ["maximize", "minimize"]
    for text, serve, words in (
        ("throughput,ttft_p99", False, "serve mode only"),
        ("throughput", True, "two or more"),
        ("throughput,speed", True, "unknown metric 'speed'"),
        ("throughput,output_tokens_per_s", True, "twice"),
    ):
        with pytest.raises(StudyError, match=words):
            parse_objectives(text, serve=serve)


def _pareto_study(tmp_path: Path) -> optuna.Study:
    """A serve study of two objectives and an SLO, its trials recorded as the tuner records them."""
    from autotune.study.lifecycle import create_or_resume
    from autotune.study.settings import StudySettings
    from autotune.trial.record import Outcome, Role

    settings = StudySettings(
        model="m",
        workload={
            "kind": "synthetic",
            "count": 8,
            "input_len": 8,
            "output_len": 8,
            "prefix_len": 0,
            "seed": 0,
        },
        space={"fixed": {}, "parameters": {"max_num_seqs": {"type": "int", "low": 1, "high": 512}}},
        mode="serve",
        load={"concurrency": 8, "request_rate": None},
        slos={"e2el_p99_ms": 1000.0},
        objectives=["output_tokens_per_s", "ttft_p99_ms"],
    )
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/p.db")
    study, _, _ = create_or_resume("p", storage, settings)
    # (max_num_seqs, tok/s, ttft p99, e2el p99): #1 and #3 are the front; #4 is fastest but late
    measured = [
        (None, 100.0, 50.0, 500.0),
        (64, 120.0, 60.0, 600.0),
        (2, 40.0, 300.0, 900.0),
        (8, 90.0, 30.0, 400.0),
    ]
    measured.append((512, 200.0, 20.0, 2000.0))
    for n, tok, ttft, e2el in measured:

        def objective(trial: optuna.Trial, n=n, tok=tok, ttft=ttft, e2el=e2el) -> tuple[float, float]:
            kwargs = (
                {"model": "m"}
                if n is None
                else {"model": "m", "max_num_seqs": trial.suggest_int("max_num_seqs", 1, 512)}
            )
            metrics = {"output_tokens_per_s": tok, "ttft_p99_ms": ttft, "e2el_p99_ms": e2el}
            TrialRecord(Outcome.SUCCESS, metrics, engine_kwargs=kwargs, trial_dir=str(tmp_path)).write(trial)
            set_constraints(trial, metrics, settings.slos)
            return tok, ttft

        if n is not None:
            study.enqueue_trial({"max_num_seqs": n}, user_attrs=TrialRecord(role=Role.ENQUEUED).attrs())
        study.optimize(objective, n_trials=1)
    return study


def test_a_pareto_study_answers_with_its_feasible_front_everywhere(tmp_path: Path, engine: EngineInfo):
    from autotune.output.export import build_export
    from autotune.output.report import write_report
    from autotune.output.show import format_show, show_doc
    from autotune.output.summary import format_summary
    from autotune.study.objectives import front
    from autotune.study.trials import summary

    study = _pareto_study(tmp_path)
    assert [t.number for t in front(study)] == [1, 0, 3]  # by throughput; #4 misses its SLO
    best = best_or_none(study)
    assert best is not None and best.number == 1

    doc = show_doc(study)
    assert [p["trial"] for p in doc["pareto_front"]] == [1, 0, 3]
    text = format_show(doc)
    assert "a Pareto front" in text and "ttft_p99_ms (lower is better)" in text
    assert "misses SLO: e2el_p99_ms" in text

    out = summary(study)
    assert out["best"]["trial"] == 1 and [p["trial"] for p in out["pareto_front"]] == [1, 0, 3]
    assert "Pareto front (output_tokens_per_s, ttft_p99_ms): #1 " in format_summary(out)

    exported = build_export(study, engine, "sqlite://", importance={}, trial=3)
    assert exported["trial_number"] == 3 and exported["values"] == {
        "output_tokens_per_s": 90.0,
        "ttft_p99_ms": 30.0,
    }
    assert [p["trial_number"] for p in exported["pareto_front"]] == [1, 0, 3]
    assert exported["pareto_front"][0]["vllm_serve_command"].startswith("vllm serve m --max-num-seqs 64")
    assert exported["serve"]["slo_misses"] == {}
    with pytest.raises(Exception, match="--trial 9"):
        build_export(study, engine, "sqlite://", importance={}, trial=9)

    page = write_report(study, tmp_path / "r.html", importance_kwargs={"n_jobs": 1}).read_text()
    assert '<section id="tradeoff"><h2>Pareto front</h2><figure><img' in page
    assert "misses its SLO: e2el_p99_ms 2,000.0 ms" in page


def test_keep_the_defaults_is_no_answer_when_the_defaults_miss_an_slo():
    """vLLM's defaults are faster but miss the SLO; validation finds nothing faster than them: the
    export is the best config that meets the SLO (said so), never the defaults; a repeat of a
    config that meets it reads as meeting it."""
    from autotune.analysis.records import trial_rows
    from autotune.output.export import build_export
    from autotune.study.settings import SETTINGS_ATTR, StudySettings
    from autotune.study.validation import open_validation, queue_rounds
    from autotune.trial.record import Outcome, Role

    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    slos = {"ttft_p99_ms": 500.0}
    settings = StudySettings(
        model="m",
        workload={"kind": "synthetic"},
        space={"fixed": {}},
        mode="serve",
        load={"concurrency": 64},
        slos=slos,
    )
    study.set_user_attr(SETTINGS_ATTR, settings.to_dict())
    for role, kwargs, value, ttft in (
        (Role.BASELINE, {"model": "m"}, 1000.0, 900.0),
        (Role.SAMPLED, {"model": "m", "max_num_seqs": 32}, 800.0, 300.0),
    ):

        def objective(trial, role=role, kwargs=kwargs, value=value, ttft=ttft):
            metrics = {"ttft_p99_ms": ttft, "output_tokens_per_s": value}
            TrialRecord(role=role, outcome=Outcome.SUCCESS, engine_kwargs=kwargs, metrics=metrics).write(
                trial
            )
            set_constraints(trial, metrics, slos)
            return value

        study.optimize(objective, n_trials=1)

    def repeat(trial):
        TrialRecord(outcome=Outcome.DUPLICATE, duplicate_of=1).write(trial)
        trial.set_constraint("ttft_p99_ms", study.trials[1].constraints["ttft_p99_ms"])
        return 800.0

    study.optimize(repeat, n_trials=1)
    val = open_validation(study, storage)
    queue_rounds(val, [(r, v) for r in range(3) for v in (0, 1)], {0: Role.BASELINE})
    val.optimize(lambda t: 1000.0 if TrialRecord.of(t).validates == 0 else 800.0, n_trials=6)

    doc = build_export(study, EngineInfo("", "", ""), "mem", importance={})
    assert doc["validation"]["verdict"].startswith("keep vLLM's defaults")
    assert doc["trial_number"] == 1 and not doc["is_baseline"] and doc["serve"]["slo_misses"] == {}
    assert "defaults miss an SLO" in doc["validation"]["note"]
    assert [r.slo_misses for r in trial_rows(study)] == [{"ttft_p99_ms": 900.0}, {}, {}]


def _validated_serve_study(candidate_round_ttft: float) -> optuna.Study:
    """A serve study whose baseline met the SLO (ttft p99 500 ms) in its search trial and misses
    it in its 3 validation rounds (700 ms); the one candidate, a little slower, has
    ``candidate_round_ttft`` in its rounds."""
    from autotune.study.settings import SETTINGS_ATTR, StudySettings
    from autotune.study.validation import open_validation, queue_rounds
    from autotune.trial.record import Outcome, Role

    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    slos = {"ttft_p99_ms": 500.0}
    settings = StudySettings(
        model="m", workload={"kind": "synthetic"}, space={"fixed": {}}, mode="serve", load={}, slos=slos
    )
    study.set_user_attr(SETTINGS_ATTR, settings.to_dict())
    for role, kwargs, value in (
        (Role.BASELINE, {"model": "m"}, 1000.0),
        (Role.SAMPLED, {"model": "m"}, 990.0),
    ):

        def objective(trial, role=role, kwargs=kwargs, value=value):
            metrics = {"ttft_p99_ms": 400.0, "output_tokens_per_s": value}
            TrialRecord(role=role, outcome=Outcome.SUCCESS, engine_kwargs=kwargs, metrics=metrics).write(
                trial
            )
            set_constraints(trial, metrics, slos)
            return value

        study.optimize(objective, n_trials=1)
    val = open_validation(study, storage)
    queue_rounds(val, [(r, v) for r in range(3) for v in (0, 1)], {0: Role.BASELINE})

    def measure(trial):
        baseline = TrialRecord.of(trial).validates == 0
        value = (1000.0, 990.0)[not baseline] + trial.number
        metrics = {"ttft_p99_ms": 700.0 if baseline else candidate_round_ttft, "output_tokens_per_s": value}
        TrialRecord(outcome=Outcome.SUCCESS, metrics=metrics).write(trial)
        return value

    val.optimize(measure, n_trials=6)
    return study


def test_defaults_that_meet_the_slo_in_the_search_but_miss_it_in_their_rounds_are_not_exported():
    """ "Keep the defaults" cannot be followed when their rounds miss an SLO: the export is the
    fastest validated config whose rounds met it, with its own validated speedup; where none
    did, there is nothing to export, and the error says what to do."""
    from autotune.errors import StudyError
    from autotune.output.export import build_export

    doc = build_export(_validated_serve_study(300.0), EngineInfo("", "", ""), "mem", importance={})
    assert doc["validation"]["baseline_slo_misses"] == {"ttft_p99_ms": 700.0}
    assert not doc["validation"]["keep_defaults"]
    assert "vLLM's defaults miss an SLO in these rounds" in doc["validation"]["verdict"]
    assert doc["trial_number"] == 1 and not doc["is_baseline"]
    assert "defaults miss an SLO" in doc["validation"]["note"]
    cand = doc["validation"]["candidates"][0]
    assert doc["speedup_over_baseline"] == cand["median"] < 1.0

    with pytest.raises(StudyError, match="neither vLLM's defaults nor any validated config met the SLOs"):
        build_export(_validated_serve_study(650.0), EngineInfo("", "", ""), "mem", importance={})


def test_failed_request_errors_are_the_exception_lines_of_the_printed_tracebacks():
    from autotune.trial.serve_worker import printed_errors

    printed = "\n".join(
        [
            "Failed requests during benchmark run detected (capping to 10):",
            "Error 0: Traceback (most recent call last):",
            '  File "endpoint_request_func.py", line 170, in async_request_openai_completions',
            "    async with session.post(url=api_url, json=payload) as response:",
            "aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected",
            "",
            "Error 1: Bad Request",
            "INFO 12-05 10:00:00 [serve.py:700] done",
            "============ Serving Benchmark Result ============",
        ]
    )
    assert printed_errors(printed) == [
        "aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected",
        "Bad Request",
    ]
