"""What a trial's engine start spent its time on, read from vLLM's own log lines.

The worker times the engine start as one phase; vLLM's INFO log (the trial's ``stdout.log``, and
``stderr.log`` for its engine-core process) says what was inside it: loading the weights,
torch.compile, CUDA-graph capture, and whether the compiled graphs came from vLLM's compile
cache or were compiled anew. Trials whose configs differ in a compile-relevant argument
(``max_num_batched_tokens``, the KV-cache dtype, quantization, the capture sizes) miss that
cache: this is where a study's engine-start seconds go, and what the study-owned cache saves.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
#: (key, pattern), the better source of a key first: each key takes its best pattern's first match
_SECONDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # the whole model load (weights read, quantized, placed); the weights' read alone is weights_s
    ("load_s", re.compile(rf"Model loading took .*? and {_NUMBER} seconds")),
    ("weights_s", re.compile(rf"Loading weights took {_NUMBER} seconds")),
    # the engine's own total (an encoder's compile included) before the last "torch.compile took"
    ("compile_s", re.compile(rf"\(compilation: {_NUMBER} s")),
    ("compile_s", re.compile(rf"torch\.compile took {_NUMBER} s in total")),
    ("cudagraph_s", re.compile(rf"Graph capturing finished in {_NUMBER} secs")),
    (
        "init_engine_s",
        re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_NUMBER} s"),
    ),
)
#: compiled graphs read from vLLM's compile cache (piecewise backend; AOT-compiled function)
_HIT = re.compile(r"Directly load the compiled graph|Directly load AOT compilation from path (\S+)")
#: graphs compiled anew (and then saved to the cache)
_MISS = re.compile(r"Compiling a graph for compile range|saved AOT compiled function to (\S+)")
#: a cache entry of the same key that vLLM could not load (then it compiles again)
_LOAD_FAILED = re.compile(r"Compiling model again due to a load failure from (\S+), reason: (.*)")
_CACHE_DIR = re.compile(r"Using cache directory: (\S+) for vLLM's torch\.compile")
_SIGNED = r"(-?[0-9]+(?:\.[0-9]+)?)"
#: the free memory at start and the CUDA graphs' memory, each from its own part of the GPU
#: worker's usage line, so that a release whose line differs elsewhere still gives them
_FREE = re.compile(rf"Free memory on device \({_NUMBER}/{_NUMBER} GiB\)")
#: the engine's memory plan in GiB as vLLM's GPU worker logs it (the CPU engine logs no such plan),
#: each with the group that holds it: the weights, the KV cache, the device's whole memory
_GIB: tuple[tuple[str, re.Pattern[str], int], ...] = (
    ("weights_gib", re.compile(rf"Model loading took {_NUMBER} GiB"), 1),
    ("kv_cache_gib", re.compile(rf"Available KV cache memory: {_NUMBER} GiB"), 1),
    ("gpu_gib", _FREE, 2),
)
_GRAPHS = re.compile(rf"{_SIGNED} GiB for CUDAGraph memory")
#: the GPU worker's whole line that sets its memory use against gpu_memory_utilization's share
#: (vLLM 0.26); where a release words it otherwise, ``beyond_gib`` is left out and the memory
#: plan assumes nothing about it
_USAGE = re.compile(
    rf"Free memory on device \({_NUMBER}/{_NUMBER} GiB\) on startup\. Desired GPU memory utilization "
    rf"is \({_NUMBER}, {_NUMBER} GiB\)\. Actual usage is {_SIGNED} GiB for weight, {_SIGNED} GiB for "
    rf"peak activation, {_SIGNED} GiB for non-torch memory, and {_SIGNED} GiB for CUDAGraph memory\."
    rf".*Current kv cache memory in use is {_SIGNED} GiB"
)


def _usage(line: str, out: dict[str, Any]) -> None:
    """One rank's usage line into ``out``: the least free memory at start, the largest graphs and
    the most held beyond the share (each rank's figures from its own line; ranks can differ)."""
    if m := _FREE.search(line):
        free = float(m.group(1))
        out["gpu_free_gib"] = min(free, out.get("gpu_free_gib", free))
    if m := _GRAPHS.search(line):
        graphs = float(m.group(1))
        out["cudagraph_gib"] = max(graphs, out.get("cudagraph_gib", graphs))
    if m := _USAGE.search(line):
        _, _, _, requested, weights, activation, non_torch, graphs, kv_cache = (float(g) for g in m.groups())
        beyond = weights + activation + non_torch + graphs + kv_cache - requested
        out["beyond_gib"] = round(max(beyond, out.get("beyond_gib", beyond)), 4)


def parse_startup(lines: Iterable[str]) -> dict[str, Any]:
    """The engine start's parts from vLLM's log ``lines``.

    Returns:
        Those found of ``load_s`` (the whole model load; ``weights_s``: reading the weights),
        ``compile_s``, ``cudagraph_s``, ``init_engine_s`` (seconds,
        as vLLM timed them), ``compile_cache`` (``"hit"``: every compiled graph came from the
        cache, ``"miss"``: all compiled anew, ``"partial"``: some of each, ``"load_failed"``:
        the cache held this config's entry and vLLM failed to load it, so it compiled again,
        the reason in ``compile_cache_error``; absent where nothing was compiled, e.g.
        ``enforce_eager``), ``compile_cache_dir``, and on a GPU the memory plan in GiB:
        ``weights_gib``, ``kv_cache_gib``, ``gpu_gib`` (the device's whole memory),
        ``gpu_free_gib`` (free at start), ``cudagraph_gib`` and ``beyond_gib`` (what the engine
        held beyond ``gpu_memory_utilization``'s share: weights, activations, non-torch memory,
        CUDA graphs and KV cache less the share, by the worker's own line; Model Runner V2's
        graphs, ~0 where the V1 runner counts them inside). A multi-process engine logs these
        per rank: the first figure of each kind is kept, but the least free memory and the most
        held beyond the share over the ranks.
    """
    out: dict[str, Any] = {}
    rank: dict[str, int] = {}  # the index in _SECONDS of each key's figure so far
    hits = misses = 0
    failed = None
    for line in lines:
        if "took" in line or "finished" in line:
            for i, (key, pattern) in enumerate(_SECONDS):
                if i < rank.get(key, len(_SECONDS)) and (m := pattern.search(line)):
                    out[key], rank[key] = float(m.group(1)), i
        if "GiB" in line:
            for key, pattern, group in _GIB:
                if key not in out and (m := pattern.search(line)):
                    out[key] = float(m.group(group))
            _usage(line, out)
        if m := _HIT.search(line):
            hits += 1
            if m.group(1):
                out.setdefault("compile_cache_dir", _entry(m.group(1)))
        elif m := _MISS.search(line):
            misses += 1
            if m.group(1):
                out.setdefault("compile_cache_dir", _entry(m.group(1)))
        elif m := _LOAD_FAILED.search(line):
            failed = failed or m.group(2).strip()
            out.setdefault("compile_cache_dir", _entry(m.group(1)))
        elif m := _CACHE_DIR.search(line):
            out.setdefault("compile_cache_dir", _entry(m.group(1)))
    if failed is not None:
        out.update(compile_cache="load_failed", compile_cache_error=failed)
    elif hits or misses:
        out["compile_cache"] = "partial" if hits and misses else "hit" if hits else "miss"
    return out


def _entry(path: str) -> str:
    """The cache entry a logged path is in: up to its ``rank_<i>_<j>`` folder (the piecewise
    backend logs ``.../rank_0_0/backbone``, the AOT path ``.../rank_0_0/model``)."""
    parts = Path(path).parts
    for i in range(len(parts) - 1, -1, -1):
        if re.fullmatch(r"rank_\d+_\d+", parts[i]):
            return str(Path(*parts[: i + 1]))
    return str(Path(path).parent)


def read_startup(*logs: Path) -> dict[str, Any]:
    """:func:`parse_startup` over the trial's log files (those that exist)."""
    lines: list[str] = []
    for log in logs:
        try:
            lines += log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
    return parse_startup(lines)
