"""Compare named vLLM configs on one model and workload, each trial in its own process.

    python -m benchmarks.compare --model-arch llama2-7b \\
        --workload synthetic:count=1000,input_len=256,output_len=256 \\
        --set load_format=dummy --set skip_tokenizer_init=true \\
        --config defaults='{}' --config seed=@seed.json --config tuned=@export.json \\
        --repeat 2 --out benchmarks/results/llama2-7b

Each config runs through :func:`autotune.trial.runner.run_trial` (the tuner's own isolated worker), with
the ``--set`` args applied on top of it. Runs are interleaved (every config once, then again) so
drift hits all alike. Before the first trial, a torch microbenchmark measures the machine's
matmul and copy rates for the roofline (:mod:`benchmarks.roofline`). ``OUT/results.json`` and
``OUT/results.md`` are rewritten after every trial; a failed config is a row, not a crash.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.atomic import write_text_atomic
from autotune.errors import AutotuneError
from autotune.space.overrides import config_from_json, parse_assignments, read_config_file
from autotune.study.settings import DEFAULT_SAMPLING, DEFAULT_WORKLOAD
from autotune.trial.record import TrialRecord
from autotune.trial.runner import TrialSpec, run_trial
from autotune.trial.workload import WorkloadSpec, load_requests, parse_workload
from benchmarks import host, report
from benchmarks.models import ARCHS, DenseShape, resolve_model
from benchmarks.roofline import Rates, dtype_name, floor_for

_log = logging.getLogger("benchmarks.compare")
_REPO = Path(__file__).resolve().parents[1]
_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*$")
FORMAT_VERSION = 1


class UsageError(Exception):
    """A bad command line; printed as one line, exit code 2."""


@dataclass(frozen=True)
class Config:
    name: str
    source: str
    params: dict[str, Any]


def parse_config(text: str) -> Config:
    """``NAME=JSON`` or ``NAME=@FILE``; a file may be an ``autotune export`` (its ``engine_kwargs``)."""
    name, eq, value = text.partition("=")
    name = name.strip()
    if not eq or not _NAME.match(name):
        raise UsageError(f"--config {text!r}: use NAME=JSON or NAME=@FILE, e.g. defaults='{{}}'")
    source = value[1:] if value.startswith("@") else "command line"
    try:
        if value.startswith("@"):
            value = read_config_file(source, f"--config {name}")
        return Config(name, source, config_from_json(value, f"--config {name}"))
    except AutotuneError as e:
        raise UsageError(str(e)) from None


def parse_set(items: list[str]) -> dict[str, Any]:
    """``ARG=VALUE`` pairs; values are YAML scalars (``true``, ``8192``, ``0.9``, ``dummy``)."""
    try:
        return parse_assignments(items)
    except AutotuneError as e:
        raise UsageError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.compare",
        description="Benchmark named vLLM configs side by side, with a roofline.",
    )
    p.add_argument(
        "--model-arch",
        required=True,
        help=f"{' | '.join(ARCHS)} (a config-only checkpoint is written) or a checkpoint directory",
    )
    p.add_argument(
        "--workload",
        default=DEFAULT_WORKLOAD,
        help="workload spec as for `autotune run --workload`",
    )
    p.add_argument(
        "--config",
        action="append",
        required=True,
        metavar="NAME=JSON|NAME=@FILE",
        help="a config to measure (repeatable); a FILE may be an autotune export",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="ARG=VALUE",
        help="engine arg for every config, winning over the config's own (repeatable)",
    )
    p.add_argument("--out", required=True, type=Path, help="directory for results.json, results.md, trials/")
    p.add_argument("--repeat", type=int, default=1, help="runs per config, interleaved (default 1)")
    p.add_argument(
        "--trial-timeout",
        type=float,
        default=1800.0,
        help="seconds before a trial is killed (a fresh GPU machine's first start takes minutes)",
    )
    p.add_argument("--warmup-requests", type=int, default=16, help="requests of the warm-up generate")
    p.add_argument("--no-roofline", action="store_true", help="skip the microbenchmark and the floors")
    p.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")
    return p


def microbench(dtypes: set[str], timeout_s: float = 900.0) -> dict[str, Any]:
    """Run :mod:`benchmarks.microbench` in a subprocess; ``{"microbench": ...}`` or ``{"error": ...}``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_REPO), os.environ.get("PYTHONPATH")])),
    }
    cmd = [sys.executable, "-m", "benchmarks.microbench", "--dtypes", ",".join(sorted(dtypes))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"microbenchmark ran past {timeout_s:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return {"error": f"microbenchmark exited {proc.returncode}: {tail}"}
    return {"microbench": json.loads(lines[-1])}


def _trial_record(name: str, rep: int, result: TrialRecord) -> dict[str, Any]:
    return {
        "config": name,
        "repeat": rep,
        "outcome": result.outcome.value if result.outcome else None,
        "error_type": result.error_type,
        "error": result.error,
        "returncode": result.returncode,
        "wall_s": result.wall_s,
        "phases_s": result.phases_s,
        "metrics": result.metrics,
        "telemetry": result.telemetry,
        "engine": result.engine,
        "trial_dir": result.trial_dir,
        "stderr": result.log,
    }


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Plan:
    """A parsed command line, ready to run."""

    doc: dict[str, Any]
    out: Path
    workload: WorkloadSpec
    shape: DenseShape | None
    requests_file: Path | None


def _entries(configs: list[Config], fixed: dict[str, Any], model: Path) -> list[dict[str, Any]]:
    """Each config's record, with the engine args it runs with (``--set`` wins over the config)."""
    entries = []
    for c in configs:
        overridden = {
            k: {"config": c.params[k], "set": v} for k, v in fixed.items() if c.params.get(k, v) != v
        }
        for k in overridden:
            _log.warning("config %s: %s=%r is overridden by --set %s=%r", c.name, k, c.params[k], k, fixed[k])
        kwargs = {"model": str(model), **c.params, **fixed}
        entries.append(
            {
                "name": c.name,
                "source": c.source,
                "params": c.params,
                "overridden": overridden,
                "engine_kwargs": kwargs,
            }
        )
    return entries


def plan(args: argparse.Namespace, argv: list[str]) -> Plan:
    """Check the command line, prepare ``--out`` (checkpoint, requests) and the results document."""
    if args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    configs = [parse_config(c) for c in args.config]
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise UsageError(f"--config names must be unique, got {names}")
    fixed = parse_set(args.set)
    out: Path = args.out
    if (out / "results.json").exists() and not args.overwrite:
        raise UsageError(f"{out} holds an earlier run; pass --overwrite or choose another --out")
    try:
        wl = parse_workload(args.workload)
        if args.overwrite and (out / "trials").is_dir():
            shutil.rmtree(out / "trials")
        out.mkdir(parents=True, exist_ok=True)
        model_path, model_cfg = resolve_model(args.model_arch, out)
        requests_file = None
        if wl.kind != "synthetic":
            requests_file = out / "requests.jsonl"
            write_text_atomic(requests_file, "".join(json.dumps(r) + "\n" for r in load_requests(wl)))
    except (AutotuneError, ValueError) as e:
        raise UsageError(str(e)) from None
    try:
        shape: DenseShape | None = DenseShape.from_config(model_cfg)
        shape_error = None
    except ValueError as e:
        shape, shape_error = None, str(e)
    machine = host.describe_host()
    doc: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "command": shlex.join(["python", "-m", "benchmarks.compare", *argv]),
        "argv": argv,
        "started_at": _now(),
        "finished_at": None,
        "status": "running",
        "host": machine,
        "device": host.device_line(machine),
        "vllm_version": host.installed_vllm(),
        "model": {
            "arch": args.model_arch,
            "path": str(model_path),
            "params": shape.params if shape else None,
            "dtype": str(model_cfg.get("torch_dtype") or model_cfg.get("dtype")),
            "shape": asdict(shape) if shape else None,
            "shape_error": shape_error,
        },
        "workload": wl.to_dict(),
        "workload_description": wl.describe(),
        "fixed": fixed,
        "sampling": dict(DEFAULT_SAMPLING),
        "warmup_requests": args.warmup_requests,
        "trial_timeout_s": args.trial_timeout,
        "repeat": args.repeat,
        "configs": _entries(configs, fixed, model_path),
        "roofline": {"error": "skipped (--no-roofline)"} if args.no_roofline else None,
        "trials": [],
        "summary": [],
    }
    return Plan(doc, out, wl, shape, requests_file)


def measure_rates(p: Plan) -> Rates | None:
    """Run the microbenchmark for the dtypes the configs compute in; None when unavailable."""
    if p.doc["roofline"] is not None:
        return None
    if p.shape is None:
        p.doc["roofline"] = {"error": f"model not modelled: {p.doc['model']['shape_error']}"}
        return None
    declared = {dtype_name(e["engine_kwargs"].get("dtype") or "auto") for e in p.doc["configs"]} - {"auto"}
    dtypes = {"bfloat16", dtype_name(p.shape.dtype), *declared} & {"bfloat16", "float16", "float32"}
    _log.info("measuring matmul (%s) and copy rates for the roofline", ", ".join(sorted(dtypes)))
    measured = p.doc["roofline"] = microbench(dtypes)
    if "microbench" in measured:
        return Rates.from_microbench(measured["microbench"])
    _log.warning("roofline unavailable: %s", measured["error"])
    return None


def run_one(p: Plan, entry: dict[str, Any], rep: int, rates: Rates | None) -> dict[str, Any]:
    """One trial of one config, in its own worker process; its record, with its roofline."""
    name = entry["name"]
    trial_dir = p.out / "trials" / name / str(rep)
    _log.info("%s run %d/%d: %s", name, rep + 1, p.doc["repeat"], json.dumps(entry["params"]))
    spec = TrialSpec(
        trial_dir=trial_dir,
        engine_kwargs=entry["engine_kwargs"],
        workload=p.workload.to_dict(),
        requests_file=str(p.requests_file) if p.requests_file else None,
        sampling=dict(p.doc["sampling"]),
        warmup_requests=p.doc["warmup_requests"],
        timeout_s=p.doc["trial_timeout_s"],
        device_ids=p.doc["host"]["device_ids"],
    )
    record = _trial_record(name, rep, run_trial(spec))
    m = record["metrics"]
    if record["outcome"] != "success":
        _log.warning("%s: %s (%s): %s", name, record["outcome"], record["error_type"], record["error"])
        return record
    if rates is not None and p.shape is not None:
        record["roofline"] = floor_for(p.shape, rates, m, record["engine"], p.workload.prefix_len).to_dict()
    _log.info(
        "%s: %.1f output tok/s, generate %.2f s, engine start %.1f s",
        name,
        m["output_tokens_per_s"],
        m["generate_s"],
        m["engine_start_s"],
    )
    return record


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    p = plan(args, argv)
    report.write(p.doc, p.out)
    # a SIGTERM (``timeout``, a job scheduler) unwinds like Ctrl-C: the running trial's process
    # group is killed by the runner and the results so far are written
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        rates = measure_rates(p)
        report.write(p.doc, p.out)
        for rep in range(args.repeat):
            for entry in p.doc["configs"]:
                p.doc["trials"].append(run_one(p, entry, rep, rates))
                report.write(p.doc, p.out)
    except KeyboardInterrupt:
        p.doc["status"] = "interrupted"
        p.doc["finished_at"] = _now()
        report.write(p.doc, p.out)
        print(f"interrupted; the finished trials are in {p.out / 'results.md'}", file=sys.stderr)
        return 130
    p.doc["status"] = "complete"
    p.doc["finished_at"] = _now()
    report.write(p.doc, p.out)
    print(report.render(p.doc))
    _log.info("wrote %s and %s", p.out / "results.json", p.out / "results.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="[compare] %(message)s", stream=sys.stderr)
    args = build_parser().parse_args(argv)
    try:
        return run(args, argv)
    except UsageError as e:
        print(f"compare: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
