"""How many tokens a config's KV cache would hold, predicted from the baseline's measured memory.

vLLM's GPU worker logs its memory plan at every engine start: the device's memory, the weights'
GiB and the KV cache's GiB (what ``gpu_memory_utilization`` leaves after weights, activations and
CUDA graphs), and the engine reports the KV cache's tokens. From the baseline's plan, with the
same model and batch shape, another config's KV cache follows without starting an engine:

- each 0.01 of ``gpu_memory_utilization`` moves 1 % of the device's memory into or out of it;
- an fp8 KV cache stores a token in half the bytes (the H200 7B study: 468,304 tokens against
  the baseline's 234,208 at the same utilisation);
- online fp8 weights free part of the weights' memory for it: Llama-2-7B's 12.55 GiB became
  6.74 GiB (46 % freed; embeddings and the LM head stay in bf16), taken as 45 % here (that
  term errs towards fewer tokens).

vLLM 0.26 sizes the KV cache so that weights, activations and KV cache fill
``gpu_memory_utilization`` of the device, then captures the CUDA graphs in the memory beyond it
(its log counts them: "... and 0.73 GiB for CUDAGraph memory"). A utilisation that leaves too
little beyond it fails at the first forward pass: on an H100 80GB, fp8 weights + KV at 0.97 with
graphs to 1,024 (1.36 GiB) left 1.02 GiB and ran out of memory allocating a 530 MiB activation
(`benchmarks/results/h100-2026-12-06-resume`, #23); at 0.96 (1.28 GiB of graphs) 1.89 GiB left
ran. :meth:`MemoryPlan.max_utilization` keeps the graphs plus :data:`RESERVE_GIB` free.

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
#: the memory to keep free beyond gpu_memory_utilization's share and the CUDA graphs (see above:
#: 1.02 GiB ran out of memory, 1.89 GiB ran)
RESERVE_GIB = 1.5


@dataclass(frozen=True)
class MemoryPlan:
    """The baseline's memory, as vLLM planned it.

    Attributes:
        gpu_gib: The device's whole memory.
        utilization: The baseline's ``gpu_memory_utilization``.
        weights_gib: Its weights.
        kv_cache_gib: Its KV cache.
        kv_tokens: The tokens that KV cache holds.
        cudagraph_gib: Its CUDA graphs (None where its log did not say, e.g. before vLLM
            counted them, or where it ran eager).
        capture: Its largest CUDA graph (``max_cudagraph_capture_size``).
    """

    gpu_gib: float
    utilization: float
    weights_gib: float
    kv_cache_gib: float
    kv_tokens: int
    cudagraph_gib: float | None = None
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
        graphs, capture = s.get("cudagraph_gib"), baseline.engine.get("max_cudagraph_capture_size")
        return cls(
            gpu,
            utilization,
            weights,
            kv_cache,
            int(tokens),
            cudagraph_gib=float(graphs) if isinstance(graphs, (int, float)) and graphs > 0 else None,
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
        """The highest ``gpu_memory_utilization`` that leaves the CUDA graphs up to ``capture``
        (None: the baseline's) and :data:`RESERVE_GIB` free. The graphs' memory is taken to grow
        in proportion to the largest graph beyond the baseline's (measured on the 7B: 0.73 GiB to
        512, 1.19-1.36 GiB to 1,024); a plan without the graphs' figure counts the reserve alone."""
        graphs = self.cudagraph_gib or 0.0
        if capture is not None and self.capture:
            graphs *= max(1.0, capture / self.capture)
        return 1.0 - (graphs + RESERVE_GIB) / self.gpu_gib
