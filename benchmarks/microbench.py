"""Peak rates of this machine for the roofline, measured with torch in its own process.

``python -m benchmarks.microbench [--device auto|cuda|cpu] [--dtypes bfloat16,float16]`` prints
one JSON object: dense matmul FLOP/s per dtype (large square ``a @ b``; the best of a few sizes)
and device copy bandwidth (``dst.copy_(src)`` of a large tensor, counted as bytes read plus bytes
written, so it compares with the bytes a decode step reads). Each rate is the best batch of
iterations after a warm-up: the roofline wants what the hardware can do, not an average.

It runs in a subprocess of :mod:`benchmarks.compare` so that its GPU memory is released before the
first trial starts, and the parent never imports torch.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from typing import Any

_GPU_SIZES = (4096, 8192, 16384)
_CPU_SIZES = (512, 1024, 2048)
_GPU_COPY_BYTES = 4 << 30
_CPU_COPY_BYTES = 512 << 20


def _best_seconds(
    fn: Callable[[], object], sync: Callable[[], None], *, budget_s: float, batch: int
) -> float:
    """Seconds one call of ``fn`` takes, the best per-call time over batches for ``budget_s``."""
    for _ in range(2):
        fn()
    sync()
    best = float("inf")
    deadline = time.perf_counter() + budget_s
    while True:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / batch)
        if time.perf_counter() > deadline:
            return best


def measure(
    device: str = "auto", dtypes: tuple[str, ...] = ("bfloat16",), budget_s: float = 2.0
) -> dict[str, Any]:
    """Measure matmul FLOP/s per dtype and copy bandwidth on ``device``."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    cuda = dev.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    info: dict[str, Any] = {"device": device, "torch_version": torch.__version__}
    if cuda:
        info["device_name"] = torch.cuda.get_device_name(dev)
    else:
        info["threads"] = torch.get_num_threads()
    matmul: dict[str, Any] = {}
    for name in dtypes:
        dtype = getattr(torch, name)
        best = 0.0
        best_n = 0
        for n in _GPU_SIZES if cuda else _CPU_SIZES:
            a = torch.randn(n, n, device=dev, dtype=dtype)
            b = torch.randn(n, n, device=dev, dtype=dtype)
            out = torch.empty(n, n, device=dev, dtype=dtype)
            batch = 10 if cuda else 2
            secs = _best_seconds(
                functools.partial(torch.matmul, a, b, out=out),
                sync,
                budget_s=budget_s / 3,
                batch=batch,
            )
            rate = 2 * n**3 / secs
            if rate > best:
                best, best_n = rate, n
            del a, b, out
            if secs * 8 * (batch + 2) > budget_s:  # the next size (8x the work) would overrun
                break  # e.g. fp16 on most CPUs, which has no fast kernel
        matmul[name] = {"flops_per_s": best, "size": best_n}
    info["matmul"] = matmul

    nbytes = _GPU_COPY_BYTES if cuda else _CPU_COPY_BYTES
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    secs = _best_seconds(functools.partial(dst.copy_, src), sync, budget_s=budget_s, batch=10 if cuda else 2)
    info["copy"] = {
        "bytes_per_s": 2 * nbytes / secs,
        "tensor_bytes": nbytes,
        "counted": "bytes read + bytes written",
    }
    del src, dst
    if cuda:
        torch.cuda.empty_cache()
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.microbench", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda, cuda:N or cpu")
    p.add_argument("--dtypes", default="bfloat16", help="comma-separated torch dtypes for the matmul")
    p.add_argument("--budget-s", type=float, default=2.0, help="seconds per measurement")
    args = p.parse_args(argv)
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    print(json.dumps(measure(args.device, dtypes, args.budget_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
