"""Lower bounds on a benchmark's generate time from the model's shape and the machine's rates.

For one measured trial (``N`` requests, ``P`` prompt and ``O`` output tokens each on average):

- **compute floor** = (linear FLOPs + attention FLOPs) / matmul FLOP/s, where linear FLOPs are
  ``2 x decoder weights x tokens run through the model`` plus ``2 x LM-head weights x sampled
  tokens`` (vLLM computes logits only where it samples), a request runs ``P + O - 1`` tokens
  (its last output token is never fed back), prompt blocks served from the prefix cache skip
  the linear layers, and attention costs ``4 x layers x heads x head_dim`` FLOPs per (query,
  causal key) pair;
- **memory floor** = (weight bytes x decode steps + KV-cache bytes read + KV-cache bytes
  written) / copy bandwidth, where every step reads the weights once (the input embedding table
  excepted: only its rows are gathered), every decode token reads its whole context's K and V
  (``2 x layers x kv_heads x head_dim`` elements per context token at the KV dtype), and every
  token run writes its K and V once.

The decode steps depend on the batch the scheduler reaches. The estimate: requests run in waves
of ``B = min(max_num_seqs, kv_cache_tokens // (P + O), N)`` (the resolved engine settings; a
request holds its whole final context), each wave taking ``O`` steps (its prefill step plus
``O - 1`` decode steps), so ``steps = ceil(N / B) x O``. Continuous batching refills a wave's
slots as requests finish, so with uneven lengths the real count can be lower; with the uniform
synthetic workloads the waves are what vLLM does.

The roofline time is the larger floor; ``fraction = floor / measured generate_s`` says how close
the run came (1.0 would be the hardware's limit). With tensor parallelism the rates are
multiplied by the GPUs used (ideal scaling).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.models import DenseShape

_DTYPE_BYTES = {"float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4, "float8": 1, "fp8": 1}


def dtype_name(value: Any) -> str:
    """``torch.float16`` / ``float16`` / ``half`` -> ``float16``; ``fp8_e4m3`` -> ``fp8``."""
    text = str(value or "").removeprefix("torch.").lower()
    if text.startswith(("fp8", "float8")):
        return "fp8"
    return {"half": "float16", "float": "float32"}.get(text, text)


def dtype_bytes(value: Any) -> int:
    name = dtype_name(value)
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown element type {value!r}")
    return _DTYPE_BYTES[name]


@dataclass(frozen=True)
class Rates:
    """The machine's measured peaks (from :mod:`benchmarks.microbench`)."""

    matmul_flops_per_s: dict[str, float]
    copy_bytes_per_s: float

    @classmethod
    def from_microbench(cls, info: dict[str, Any]) -> Rates:
        return cls(
            {dtype_name(k): float(v["flops_per_s"]) for k, v in info["matmul"].items()},
            float(info["copy"]["bytes_per_s"]),
        )

    def matmul(self, dtype: str) -> tuple[float, str]:
        """FLOP/s for ``dtype``, else for bfloat16 (the same dense rate on NVIDIA tensor cores)."""
        name = dtype_name(dtype)
        if name in self.matmul_flops_per_s:
            return self.matmul_flops_per_s[name], name
        if "bfloat16" in self.matmul_flops_per_s:
            return self.matmul_flops_per_s["bfloat16"], "bfloat16"
        name, rate = next(iter(self.matmul_flops_per_s.items()))
        return rate, name


@dataclass(frozen=True)
class Floor:
    """The roofline of one trial."""

    compute_s: float
    memory_s: float
    floor_s: float
    bound: str
    fraction: float | None
    ceiling_output_tokens_per_s: float
    ceiling_total_tokens_per_s: float
    batch: int
    decode_steps: int
    flops: float
    bytes: float
    weight_dtype: str
    kv_dtype: str
    matmul_rate_dtype: str
    cached_prefix_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def floor_for(
    shape: DenseShape,
    rates: Rates,
    metrics: dict[str, Any],
    engine: dict[str, Any],
    prefix_len: int = 0,
) -> Floor:
    """The roofline of a successful trial from its ``metrics`` and resolved ``engine`` facts."""
    n = int(metrics["num_requests"])
    p = metrics["prompt_tokens"] / n
    o = metrics["output_tokens"] / n
    gpus = int(engine.get("tensor_parallel_size") or 1)
    weight_dtype = dtype_name(engine.get("dtype") or shape.dtype)
    if str(engine.get("quantization") or "").startswith("fp8"):
        weight_dtype = "fp8"
    cache_dtype = str(engine.get("cache_dtype") or "auto")
    kv_dtype = (
        dtype_name(engine.get("dtype") or shape.dtype) if cache_dtype == "auto" else dtype_name(cache_dtype)
    )

    cached = 0
    block = int(engine.get("block_size") or 0)
    if engine.get("enable_prefix_caching") and prefix_len and block:
        cached = min(prefix_len // block * block, int(p) - 1)
    forward = p + o - 1  # tokens one request runs through the model
    run_tokens = n * forward - (n - 1) * cached
    linear = 2.0 * shape.layers * shape.layer_params * run_tokens + 2.0 * shape.embedding_params * n * o

    def causal_pairs(start: float, end: float) -> float:  # sum of (i + 1) for i in [start, end)
        return (end * (end + 1) - start * (start + 1)) / 2

    pairs = causal_pairs(0, forward) + (n - 1) * causal_pairs(cached, forward)
    attention = 4.0 * shape.layers * shape.heads * shape.head_dim * pairs
    rate, rate_dtype = rates.matmul(weight_dtype if weight_dtype != "fp8" else shape.dtype)
    compute_s = (linear + attention) / (rate * gpus)

    max_seqs = int(engine.get("max_num_seqs") or n)
    kv_tokens = engine.get("kv_cache_tokens") or metrics.get("kv_cache_tokens")
    per_request = math.ceil(p + o)
    batch = min(max_seqs, int(kv_tokens) // per_request) if kv_tokens else max_seqs
    batch = max(1, min(batch, n))
    steps = math.ceil(n / batch) * math.ceil(o)
    read_weights = shape.params - (0 if shape.tied_embeddings else shape.embedding_params)
    weight_bytes = read_weights * dtype_bytes(weight_dtype) * steps
    decode = max(o - 1, 0)
    context_reads = n * (decode * p + decode * (decode - 1) / 2)
    kv_per_token = shape.kv_elements_per_token * dtype_bytes(kv_dtype)
    moved = weight_bytes + kv_per_token * (context_reads + run_tokens)
    memory_s = moved / (rates.copy_bytes_per_s * gpus)

    floor_s = max(compute_s, memory_s)
    generate_s = metrics.get("generate_s")
    return Floor(
        compute_s=compute_s,
        memory_s=memory_s,
        floor_s=floor_s,
        bound="compute" if compute_s >= memory_s else "memory",
        fraction=floor_s / generate_s if generate_s else None,
        ceiling_output_tokens_per_s=metrics["output_tokens"] / floor_s,
        ceiling_total_tokens_per_s=(metrics["prompt_tokens"] + metrics["output_tokens"]) / floor_s,
        batch=batch,
        decode_steps=steps,
        flops=linear + attention,
        bytes=moved,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        matmul_rate_dtype=rate_dtype,
        cached_prefix_tokens=cached,
    )
