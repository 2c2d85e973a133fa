"""How many tokens a config's KV cache would hold, predicted from the baseline's measured memory.

vLLM's GPU worker logs its memory plan at every engine start: the device's memory, the weights'
GiB and the KV cache's GiB (what ``gpu_memory_utilization``'s share leaves after weights,
activations and non-torch memory, and, with the V1 runner, its CUDA graphs), and the engine
reports the KV cache's tokens. From the baseline's plan, with the
same model and batch shape, another config's KV cache follows without starting an engine:

- each 0.01 of ``gpu_memory_utilization`` moves 1 % of the device's memory into or out of it;
- an fp8 KV cache stores a token in half the bytes (the H200 7B study: 468,304 tokens against
  the baseline's 234,208 at the same utilisation);
- online fp8 weights free part of the weights' memory for it: Llama-2-7B's 12.55 GiB became
  6.74 GiB (46 % freed; embeddings and the LM head stay in bf16), taken as 45 % here (that
  term errs towards fewer tokens).

Beyond the utilisation's share: vLLM 0.26 asks for ``gpu_memory_utilization`` x the device's
memory for weights, activations, non-torch memory and KV cache; with its Model Runner V2 (the
default for dense models such as Llama) it then captures the CUDA graphs outside that share (its
log: "Actual usage is 12.55 GiB for weight, 1.47 GiB for peak activation, 0.22 GiB for non-torch
memory, and 0.73 GiB for CUDAGraph memory ... kv cache memory in use is 114.37 GiB" at 0.92 x
139.8 = 128.62 GiB: 0.72 GiB beyond), while the V1 runner counts its graph estimate inside the
share. The plan takes what the baseline held beyond the share from that line, whichever runner
(the graphs' own figure where the line lacks the rest), and scales it with the largest CUDA
graph (under V1 that scales only the estimate's error, and larger graphs shrink the KV cache
instead: then the config holds fewer tokens than predicted, never more memory). A utilisation
that leaves too little of the memory free at start beside it fails at the first forward pass: on
an H100 80GB (78.66 GiB free at start), fp8 weights + KV at 0.97 with graphs to 1,024 (1.36 GiB)
left 0.50 GiB and ran out of memory allocating a 530 MiB activation
(`benchmarks/results/h100-2026-12-06-resume`, #23); at 0.96 (1.28 GiB of graphs) 1.37 GiB left
ran (#29). :meth:`MemoryPlan.max_utilization` keeps :data:`RESERVE_GIB` free.

Activations and CUDA graphs are taken as the baseline's: at the baseline's batch shape the plan
was within 0.2 % of what the H200 study's fp8 trials held; a config that changes them holds more
or less than predicted (the same study's trials with other ``max_num_batched_tokens`` and graph
sizes: -1.4 % to +1.9 %; activations take ~90 KiB per batched token on the 7B).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.trial.record import TrialRecord

#: the share of bf16 weights' memory that online fp8 quantization frees (46 % measured, 7B)
FP8_WEIGHTS_FREED = 0.45
#: the memory to keep free beside gpu_memory_utilization's share and what the engine holds beyond
#: it (see above: 0.50 GiB ran out of memory at the first forward pass, 1.37 GiB ran; one 7B pair:
#: a larger model's first forward pass may allocate more)
RESERVE_GIB = 1.0


@dataclass(frozen=True)
class MemoryPlan:
    """The baseline's memory, as vLLM planned it.

    Attributes:
        gpu_gib: The device's whole memory.
        utilization: The baseline's ``gpu_memory_utilization``.
        weights_gib: Its weights.
        kv_cache_gib: Its KV cache.
        kv_tokens: The tokens that KV cache holds.
        free_gib: The device's free memory when it started (None: not logged).
        beyond_gib: What it held beyond the utilisation's share (its CUDA graphs under Model
            Runner V2; None where its log did not say).
        capture: Its largest CUDA graph (``max_cudagraph_capture_size``).
    """

    gpu_gib: float
    utilization: float
    weights_gib: float
    kv_cache_gib: float
    kv_tokens: int
    free_gib: float | None = None
    beyond_gib: float | None = None
    capture: int | None = None

    @classmethod
    def of(cls, baseline: TrialRecord) -> MemoryPlan | None:
        """The plan of ``baseline`` (None where its log held none, e.g. on the CPU engine)."""
        s = baseline.startup
        figures = (
            s.get("gpu_gib"),
            baseline.engine.get("gpu_memory_utilization"),
            s.get("weights_gib"),
            s.get("kv_cache_gib"),
            baseline.metrics.get("kv_cache_tokens"),
        )
        if not all(isinstance(f, (int, float)) and f > 0 for f in figures):
            return None
        gpu, utilization, weights, kv_cache, tokens = (float(f) for f in figures)  # type: ignore[arg-type]
        held = s.get("beyond_gib")
        held = s.get("cudagraph_gib") if held is None else held
        free, capture = s.get("gpu_free_gib"), baseline.engine.get("max_cudagraph_capture_size")
        return cls(
            gpu,
            utilization,
            weights,
            kv_cache,
            int(tokens),
            free_gib=float(free) if isinstance(free, (int, float)) and free > 0 else None,
            beyond_gib=max(0.0, float(held)) if isinstance(held, (int, float)) else None,
            capture=capture if isinstance(capture, int) and capture > 0 else None,
        )

    def _gib_per_token(self, fp8_kv: bool) -> float:
        return self.kv_cache_gib / self.kv_tokens / (2 if fp8_kv else 1)

    def _freed_gib(self, fp8_weights: bool) -> float:
        return FP8_WEIGHTS_FREED * self.weights_gib if fp8_weights else 0.0

    def kv_tokens_at(
        self, utilization: float | None = None, *, fp8_kv: bool = False, fp8_weights: bool = False
    ) -> int:
        """The tokens the KV cache holds at ``utilization`` (None: the baseline's)."""
        u = self.utilization if utilization is None else utilization
        gib = self.kv_cache_gib + (u - self.utilization) * self.gpu_gib + self._freed_gib(fp8_weights)
        return max(0, int(gib / self._gib_per_token(fp8_kv)))

    def utilization_for(self, tokens: int, *, fp8_kv: bool = False, fp8_weights: bool = False) -> float:
        """The ``gpu_memory_utilization`` at which the KV cache holds ``tokens`` (unrounded)."""
        gib = tokens * self._gib_per_token(fp8_kv) - self.kv_cache_gib - self._freed_gib(fp8_weights)
        return self.utilization + gib / self.gpu_gib

    def max_utilization(self, capture: int | None = None) -> float:
        """The highest ``gpu_memory_utilization`` that leaves, of the memory free at start, what
        the engine holds beyond the share with CUDA graphs up to ``capture`` (None: the
        baseline's) and :data:`RESERVE_GIB`. That memory is taken to grow in proportion to the
        largest graph beyond the baseline's (the 7B: 0.73 GiB to 512, 1.19-1.36 GiB to 1,024);
        never below the baseline's own utilisation at the baseline's graphs, where it ran. Where
        the baseline's log did not say what it held beyond the share, or it captured no graphs
        to scale from for a config that does, the baseline's own utilisation: nothing above it
        is known to fit."""
        if self.beyond_gib is None or self.free_gib is None or (capture and not self.capture):
            return self.utilization
        room = self.free_gib - RESERVE_GIB
        if capture is not None and self.capture is not None and capture > self.capture:
            return (room - self.beyond_gib * capture / self.capture) / self.gpu_gib
        return max((room - self.beyond_gib) / self.gpu_gib, self.utilization)
