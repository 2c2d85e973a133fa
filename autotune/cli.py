"""The ``autotune`` command: ``run``, ``export``, ``demo``, ``importance``, ``report``, ``ls``, ``show``.

Every ``AutotuneError`` becomes one line on stderr and exit code 2; ``--debug`` adds tracebacks.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune._logging import configure, get_logger
from autotune.errors import AutotuneError, StudyError

_logger = get_logger(__name__)
DEFAULT_WORKLOAD = "synthetic:count=1000,input_len=256,output_len=256"


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


def _study_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--study", required=True, help="study name; the same name resumes it")
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
        help="seconds before a trial's process group is killed",
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
        help="a config to measure next, e.g. a hand-tuned one (repeatable)",
    )
    p.add_argument(
        "--time-budget",
        type=_positive_float,
        metavar="SEC",
        help="start no trial that would likely end after SEC seconds of this run",
    )
    p.add_argument("--seed", type=int, default=0, help="sampler seed of a new study")
    p.add_argument("--no-bar", action="store_true", help="log lines only, no progress bar")


def _parse_set(items: list[str]) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise AutotuneError(f"--set {item!r}: use ARG=VALUE, e.g. --set max_model_len=4096")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def _read_text(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise AutotuneError(
            f"{flag} {path[:60]!r}: not a JSON object and not a readable file ({reason}); "
            "give the config inline, e.g. '{\"max_num_seqs\": 256}', or a path to a JSON file"
        ) from None


def _parse_enqueue(items: list[str]) -> list[dict[str, Any]]:
    configs = []
    for item in items:
        text = item if item.lstrip().startswith("{") else _read_text(item, "--enqueue")
        try:
            cfg = json.loads(text)
        except json.JSONDecodeError as e:
            raise AutotuneError(
                f"--enqueue {item[:60]!r}: not a JSON object or a JSON file ({e.msg})"
            ) from None
        if isinstance(cfg, dict) and isinstance(cfg.get("engine_kwargs"), dict):
            cfg = cfg["engine_kwargs"]  # an export file: re-measure its config
        if not isinstance(cfg, dict):
            raise AutotuneError(f"--enqueue {item[:60]!r}: must be a JSON object of engine args")
        cfg.pop("model", None)
        configs.append(cfg)
    return configs


def cmd_run(args: argparse.Namespace) -> int:
    """Create or resume a study and run ``--trials`` trials of it."""
    from autotune.tuning.placement import parse_gpus
    from autotune.tuning.run import RunRequest, run_study

    request = RunRequest(
        study=args.study,
        storage=args.storage,
        studies_dir=args.studies_dir,
        model=args.model,
        workload=args.workload,
        space=args.space,
        objective=args.objective,
        trials=args.trials,
        trial_timeout_s=args.trial_timeout,
        fixed=_parse_set(args.set),
        enqueue=_parse_enqueue(args.enqueue),
        seed=args.seed,
        time_budget_s=args.time_budget,
        show_bar=not args.no_bar and sys.stderr.isatty(),
        gpus=parse_gpus(args.gpus) if args.gpus is not None else None,
        gpus_per_trial=args.gpus_per_trial,
        heartbeat_s=args.heartbeat,
    )
    summary = run_study(request)
    print(json.dumps(summary, indent=2))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write the study's best config as JSON."""
    from autotune.output.export import build_export, write_export
    from autotune.space.engine_args import describe_engine
    from autotune.study.lifecycle import load_existing
    from autotune.study.storage import check_study_name, default_url, open_storage, redact

    name = check_study_name(args.study)
    url = args.storage or default_url(name, args.studies_dir)
    if args.storage is None and not (args.studies_dir / f"{name}.db").is_file():
        raise StudyError(f"no study {name!r} in {args.studies_dir}/ (give --storage if it lives elsewhere)")
    study = load_existing(name, open_storage(url))
    if study is None:
        raise StudyError(f"no study named {name!r} in {redact(url)}")
    importance: dict[str, Any] = {"status": "skipped", "message": "exported with --no-importance"}
    if not getattr(args, "no_importance", False):  # cmd_demo calls this with a bare Namespace
        from autotune.analysis.importance import export_importance

        importance, table = export_importance(study)
        print(table)
    doc = build_export(study, describe_engine(), redact(url), importance=importance)
    path = write_export(doc, args.out)
    speed = doc["speedup_over_baseline"]
    _logger.info(
        "exported trial #%d (%s %.1f%s) to %s",
        doc["trial_number"],
        doc["objective"],
        doc["value"],
        f", x{speed:.2f} vs vLLM defaults" if speed else "",
        path,
    )
    return 0


def cmd_importance(args: argparse.Namespace) -> int:
    """Rank what drives the study's objective and what makes configs infeasible."""
    from autotune.analysis.importance import compute_importance, format_table
    from autotune.analysis.records import open_study

    study, _ = open_study(args.study, args.storage, args.studies_dir)
    report = compute_importance(study, n_jobs=args.jobs, seed=args.seed)
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_table(report))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write a self-contained HTML report of the study."""
    from autotune.analysis.records import open_study
    from autotune.output.report import write_report

    study, url = open_study(args.study, args.storage, args.studies_dir)
    path = write_report(study, args.out, storage=url, importance_kwargs={"n_jobs": args.jobs})
    _logger.info("open it in a browser: %s", path.resolve().as_uri())
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    """List the studies in a storage (or in every study database of --studies-dir)."""
    import dataclasses

    from autotune.analysis.records import format_list, list_studies, storage_urls

    rows = list_studies(storage_urls(args.storage, args.studies_dir))
    print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2) if args.json else format_list(rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Show one study: its settings, the best trial against the baseline, every trial."""
    from autotune.analysis.records import format_show, open_study, show_doc

    study, url = open_study(args.study, args.storage, args.studies_dir)
    doc = show_doc(study, url)
    print(json.dumps(doc, indent=2, default=str) if args.json else format_show(doc))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Build a tiny random-weight Llama and tune it for real on the installed vLLM."""
    from autotune.demo.tiny_model import build_tiny_llama
    from autotune.tuning.run import RunRequest, run_study

    model_dir = args.studies_dir / "demo-model"
    _logger.info("building a tiny random-weight Llama in %s", model_dir)
    build_tiny_llama(model_dir)
    request = RunRequest(
        study=args.study,
        storage=args.storage,
        studies_dir=args.studies_dir,
        model=str(model_dir),
        workload=args.workload,
        space=args.space,
        objective="output_tokens_per_s",
        trials=args.trials or 6,
        trial_timeout_s=args.trial_timeout,
        warn_short_measurement=False,  # the demo's workload is small by design
        fixed=_parse_set(args.set),
        enqueue=_parse_enqueue(args.enqueue),
        seed=args.seed,
        time_budget_s=args.time_budget,
        show_bar=not args.no_bar and sys.stderr.isatty(),
    )
    summary = run_study(request)
    out = args.studies_dir / f"{args.study}-best.json"
    ns = argparse.Namespace(study=args.study, storage=args.storage, studies_dir=args.studies_dir, out=out)
    cmd_export(ns)
    print(json.dumps(summary, indent=2))
    return 0


def _interrupt(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM: every running trial stops (a second press: at once), then unwind."""
    from autotune.trial.runner import request_stop

    request_stop()
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    from autotune import __version__
    from autotune.study.settings import OBJECTIVES

    parser = argparse.ArgumentParser(prog="autotune", description="Bayesian auto-tuner for vLLM.")
    parser.add_argument("--version", action="version", version=f"vllm-autotune {__version__}")
    parser.add_argument("--debug", action="store_true", help="verbose logs and tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="create or resume a study and run trials")
    run.add_argument("--model", help="checkpoint directory or hub id (required for a new study)")
    run.add_argument("--workload", help=f"prompts to benchmark (default {DEFAULT_WORKLOAD})")
    run.add_argument("--space", help="search space YAML, or a bundled name (default throughput)")
    run.add_argument(
        "--objective", choices=OBJECTIVES, help="metric to maximise (default output_tokens_per_s)"
    )
    _study_args(run)
    _run_args(run)
    run.add_argument(
        "--gpus",
        metavar="IDS",
        help="GPUs to use (nvidia-smi indices, e.g. 0,1,2,3 or 0-7); default: all visible",
    )
    run.add_argument(
        "--gpus-per-trial",
        type=_positive_int,
        metavar="N",
        help="GPUs of one trial (bounds tensor_parallel_size); the GPUs run len(gpus)/N trials "
        "at a time (default: all of them, one trial at a time)",
    )
    run.add_argument(
        "--heartbeat",
        type=_positive_int,
        metavar="SEC",
        help="seconds between a running trial's heartbeats in the storage (a new study: 30, then "
        "stored for every worker); a trial silent for 4x as long (its worker killed, its machine "
        "lost) is failed and its config run again",
    )
    run.set_defaults(func=cmd_run)

    export = sub.add_parser("export", help="write the best config of a study as JSON")
    _study_args(export)
    export.add_argument("--out", required=True, type=Path, help="JSON file to write")
    export.add_argument(
        "--no-importance", action="store_true", help="skip the parameter importance ranking (seconds)"
    )
    export.set_defaults(func=cmd_export)

    importance = sub.add_parser("importance", help="rank what drives the objective and what causes OOMs")
    _study_args(importance)
    importance.add_argument("--jobs", type=int, default=-1, help="parallel refits (default: one per core)")
    importance.add_argument("--seed", type=int, default=0, help="seed of the surrogates and their folds")
    importance.add_argument("--json", action="store_true", help="print the JSON that exports store")
    importance.set_defaults(func=cmd_importance)

    report = sub.add_parser("report", help="write a self-contained HTML report of a study")
    _study_args(report)
    report.add_argument("--out", required=True, type=Path, help="HTML file to write")
    report.add_argument("--jobs", type=int, default=-1, help="parallel refits (default: one per core)")
    report.set_defaults(func=cmd_report)

    ls = sub.add_parser("ls", help="list the studies in a storage, with counts and speedups")
    ls.add_argument("--storage", help="Optuna storage URL (default: every *.db in --studies-dir)")
    ls.add_argument("--studies-dir", default="studies", type=Path, help="where study databases live")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=cmd_ls)

    show = sub.add_parser("show", help="one study: settings, best vs baseline, the trials")
    _study_args(show)
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=cmd_show)

    demo = sub.add_parser("demo", help="tune a tiny local Llama for real (no GPU, no model hub)")
    demo.set_defaults(study="demo", storage=None)
    demo.add_argument("--study", default="demo")
    demo.add_argument("--storage")
    demo.add_argument("--studies-dir", default="studies", type=Path)
    demo.add_argument("--workload", default="synthetic:count=128,input_len=64,output_len=64")
    demo.add_argument("--space", default="cpu")
    _run_args(demo, demo=True)
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure(logging.DEBUG if args.debug else logging.INFO)
    func: Callable[[argparse.Namespace], int] = args.func
    # Ctrl-C, or a scheduler's or `timeout`'s SIGTERM, must take the running trials' process
    # groups down too: each runs in its own session, so only runner.run_trial can kill it, and
    # parallel trials wait in threads the signal never reaches
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        return func(args)
    except AutotuneError as e:
        return _error(args, str(e))
    except KeyboardInterrupt:
        print("autotune: interrupted; finished trials are saved, the same command resumes", file=sys.stderr)
        return 130
    except OSError as e:  # a disk that filled up, a directory that became read-only, ...
        where = f" {e.filename}" if e.filename else ""
        return _error(
            args,
            f"cannot read or write{where}: {e.strerror or e}; free space or fix permissions, then "
            "run the same command again (finished trials are saved)",
        )
    except Exception as e:
        # SQLAlchemy's errors, raised as such or wrapped by Optuna (StorageInternalError)
        cause = e.__cause__ if type(e).__name__ == "StorageInternalError" and e.__cause__ else e
        if not type(cause).__module__.startswith("sqlalchemy"):
            raise
        from autotune.study.storage import describe_db_error

        return _error(
            args,
            f"the study database failed: {describe_db_error(cause)} (finished trials are saved: "
            "its writes are transactional); the same command resumes",
        )


def _error(args: argparse.Namespace, message: str) -> int:
    """One line on stderr (the traceback too with --debug), exit code 2."""
    if args.debug:
        _logger.exception("error")
    print(f"autotune: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
