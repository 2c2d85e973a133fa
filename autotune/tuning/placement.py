"""Which GPUs each parallel trial gets: ``--gpus`` split into slots of ``--gpus-per-trial``.

A slot is one trial's share of the node: its GPUs, pinned through ``CUDA_VISIBLE_DEVICES`` (in
``nvidia-smi``'s PCI order, the order NVML telemetry uses too), and its own range of vLLM ports,
so engines that start at the same moment never race for one port. Trials take a free slot and
give it back when their process group is gone.
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Iterator
from dataclasses import dataclass, field

from autotune.errors import PlacementError

#: first vLLM port of slot 0; slot i scans upward from PORT_BASE + i * PORT_STRIDE
PORT_BASE = 29600
PORT_STRIDE = 100
#: first API-server port of slot 0 in serve mode, the same stride apart
SERVE_PORT_BASE = 28000


@dataclass(frozen=True)
class Slot:
    """The GPUs (NVML indices) and environment one trial process runs with."""

    index: int
    device_ids: tuple[int, ...]
    env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return ",".join(map(str, self.device_ids)) or "-"

    @property
    def serve_port(self) -> int:
        """Where this slot's serve trials look for a free port for vLLM's server."""
        return SERVE_PORT_BASE + self.index * PORT_STRIDE


def parse_gpus(text: str) -> list[int]:
    """``"0,1,2,3"`` or ``"0-3"`` (or a mix) as a list of distinct GPU indices."""
    ids: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        lo, dash, hi = part.partition("-")
        try:
            span = range(int(lo), int(hi) + 1) if dash else range(int(part), int(part) + 1)
        except ValueError:
            raise PlacementError(
                f"--gpus {text!r}: {part!r} is not a GPU index; give nvidia-smi indices like 0,1,2,3 or 0-3"
            ) from None
        if not span or span.start < 0:
            raise PlacementError(f"--gpus {text!r}: {part!r} is an empty or negative range")
        for i in span:
            if i in ids:
                raise PlacementError(f"--gpus {text!r}: GPU {i} is listed twice")
            ids.append(i)
    return ids


def plan_slots(
    gpus: list[int] | None,
    per_trial: int | None,
    *,
    visible: list[int],
    platform: str,
) -> list[Slot]:
    """Split the GPUs into one slot per parallel trial.

    Args:
        gpus: ``--gpus`` (NVML indices), or None for every GPU this process sees.
        per_trial: ``--gpus-per-trial``, or None for all of them (one trial at a time).
        visible: NVML indices this process may use (:func:`autotune.trial.telemetry.visible_device_ids`).
        platform: vLLM's platform; ``cpu`` runs one trial at a time on no GPU.

    Raises:
        PlacementError: GPUs asked for on a CPU build or not present, or a split that doesn't fit.
    """
    if platform == "cpu":
        if gpus is not None or (per_trial or 1) > 1:
            raise PlacementError(
                "--gpus/--gpus-per-trial: the installed vLLM runs on the CPU (platform cpu); "
                "drop them, or install the CUDA build (scripts/setup.sh gpu)"
            )
        return [Slot(0, ())]
    if gpus is None:
        if not visible:
            raise PlacementError("--gpus-per-trial: NVML sees no GPU here; check the driver or give --gpus")
        if per_trial is None:  # the default: one trial at a time on what the process sees, unpinned
            return [Slot(0, tuple(visible))]
        gpus = visible
    elif visible:
        missing = [i for i in gpus if i not in visible]
        if missing:
            raise PlacementError(
                f"--gpus: GPU(s) {missing} are not visible to this process (it sees "
                f"{visible or 'none'}); use nvidia-smi indices, within CUDA_VISIBLE_DEVICES if set"
            )
    per = len(gpus) if per_trial is None else per_trial
    if per > len(gpus) or len(gpus) % per:
        raise PlacementError(
            f"--gpus-per-trial {per}: {len(gpus)} GPU(s) {gpus} don't split into groups of {per}; "
            "give a divisor of the GPU count"
        )
    return [
        Slot(
            i,
            tuple(group),
            {
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "CUDA_VISIBLE_DEVICES": ",".join(map(str, group)),
                "VLLM_PORT": str(PORT_BASE + i * PORT_STRIDE),
            },
        )
        for i, group in enumerate(gpus[j : j + per] for j in range(0, len(gpus), per))
    ]


class SlotPool:
    """Thread-safe pool of slots; ``with pool.take() as slot`` blocks until one is free."""

    def __init__(self, slots: list[Slot]) -> None:
        if not slots:
            raise ValueError("a pool needs at least one slot")
        self.slots = list(slots)
        self._free: queue.Queue[Slot] = queue.Queue()
        for s in self.slots:
            self._free.put(s)

    @property
    def gpus_per_trial(self) -> int:
        return max(1, len(self.slots[0].device_ids))

    @contextlib.contextmanager
    def take(self) -> Iterator[Slot]:
        slot = self._free.get()
        try:
            yield slot
        finally:
            self._free.put(slot)
