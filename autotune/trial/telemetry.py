"""GPU telemetry through NVML (nvidia-ml-py), sampled in the parent while a trial runs.

Without NVML (a CPU machine, no driver) every call degrades to "unavailable"; nothing raises.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune._logging import get_logger

_logger = get_logger(__name__)


def _nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def _text(value: bytes | str) -> str:
    """An NVML string: bytes in older nvidia-ml-py releases, str in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def visible_device_ids() -> list[int]:
    """NVML indices of the GPUs this process may use (``CUDA_VISIBLE_DEVICES``), [] without NVML."""
    nvml = _nvml()
    if nvml is None:
        return []
    try:
        count = nvml.nvmlDeviceGetCount()
    except Exception:
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(range(count))
    ids = []
    for part in env.split(","):
        part = part.strip()
        if part.isdigit() and int(part) < count:
            ids.append(int(part))
        elif part:
            break  # a UUID or an invalid entry: CUDA stops at the first one it can't use
    return ids


def machine(device_ids: list[int]) -> dict[str, Any]:
    """Where a trial runs: the host's name and the UUIDs of the trial's own GPUs (``gpu_uuids``,
    NVML indices ``device_ids``; left out without NVML, or where one of them cannot be read). Two
    GPUs of one type measure the same config a few percent apart, in one host or two, so a ratio
    is only sound between measurements of one device (see :meth:`TrialRecord.same_device`)."""
    out: dict[str, Any] = {"host": socket.gethostname()}
    nvml = _nvml() if device_ids else None
    if nvml is None:
        return out
    uuids = []
    for i in device_ids:
        try:
            uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
        except Exception as e:
            _logger.debug("NVML UUID of GPU %d unavailable: %s", i, e)
            return out
        uuids.append(_text(uuid))
    out["gpu_uuids"] = uuids
    return out


def gpu_names(ids: list[int]) -> list[str]:
    nvml = _nvml()
    if nvml is None:
        return []
    names = []
    for i in ids:
        try:
            name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))
            names.append(_text(name))
        except Exception:
            names.append("unknown")
    return names


@dataclass
class GpuSampler:
    """Samples utilisation, memory and power of ``device_ids`` every ``interval_s`` in a thread."""

    device_ids: list[int]
    interval_s: float = 0.5
    samples: list[tuple[float, float, float, float]] = field(default_factory=list)
    available: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> GpuSampler:
        nvml = _nvml() if self.device_ids else None
        if nvml is None:
            return self
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in self.device_ids]
        except Exception as e:
            _logger.debug("NVML handles unavailable: %s", e)
            return self
        self.available = True
        self._thread = threading.Thread(target=self._loop, args=(nvml, handles), daemon=True)
        self._thread.start()
        return self

    def _loop(self, nvml: Any, handles: list[Any]) -> None:
        while not self._stop.is_set():
            now = time.time()
            try:
                util = [nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]
                mem = [nvml.nvmlDeviceGetMemoryInfo(h).used for h in handles]
                power = [nvml.nvmlDeviceGetPowerUsage(h) / 1000.0 for h in handles]
                self.samples.append((now, sum(util) / len(util), float(sum(mem)), sum(power)))
            except Exception as e:
                _logger.debug("NVML sample failed: %s", e)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(self, window: tuple[float, float] | None = None) -> dict[str, Any]:
        """Mean utilisation (%) and power (W) over ``window`` (the generate phase), peak memory."""
        if not self.available:
            return {"available": False, "reason": "NVML unavailable (no NVIDIA GPU or driver)"}
        inside = [s for s in self.samples if window is None or window[0] <= s[0] <= window[1]]
        out: dict[str, Any] = {
            "available": True,
            "device_ids": self.device_ids,
            "samples": len(self.samples),
            "peak_memory_bytes": max((s[2] for s in self.samples), default=None),
        }
        if inside:
            out["mean_gpu_util_pct"] = sum(s[1] for s in inside) / len(inside)
            out["mean_power_w"] = sum(s[3] for s in inside) / len(inside)
        return out


def _gpu_processes(nvml: Any, ids: list[int]) -> list[int]:
    pids = []
    for i in ids:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            pids += [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        except Exception:  # unknown means "don't wait for it"
            continue
    return pids


def wait_for_idle_gpus(
    ids: list[int],
    timeout_s: float = 120.0,
    interval_s: float = 1.0,
    should_stop: Callable[[], bool] = lambda: False,
) -> bool:
    """Wait until no process computes on GPUs ``ids`` (a previous engine may still be freeing its
    memory), at most ``timeout_s`` or until ``should_stop()``; True when idle. Without NVML: True
    at once."""
    nvml = _nvml() if ids else None
    if nvml is None:
        return True
    deadline = time.monotonic() + timeout_s
    said = False
    while pids := _gpu_processes(nvml, ids):
        if should_stop():
            return False
        if time.monotonic() > deadline:
            _logger.warning(
                "GPU(s) %s still used by process(es) %s after %.0f s; starting the trial anyway "
                "(its memory figures may be off)",
                ids,
                pids,
                timeout_s,
            )
            return False
        if not said:
            _logger.info("waiting for process(es) %s to release GPU(s) %s", pids, ids)
            said = True
        time.sleep(interval_s)
    return True
