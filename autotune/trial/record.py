"""The record of one trial: what ran, how it ended, what it measured, and the study's bookkeeping.

This module owns every key vllm-autotune stores on an Optuna trial (its user attributes) and the
schema of a trial directory's ``result.json``: both are a :class:`TrialRecord`, read with
:meth:`TrialRecord.of` / :meth:`TrialRecord.read_json` and written with :meth:`TrialRecord.write`
/ :meth:`TrialRecord.write_json`. Nothing else names a key.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class Outcome(str, enum.Enum):
    """What a trial came to; decides the Optuna state it is told with."""

    SUCCESS = "success"  # COMPLETE with its objective value
    OOM = "oom"  # PRUNED: the sampler learns to avoid the region
    INVALID = "invalid"  # PRUNED: vLLM (or a constraint of the space) rejected the config
    QUALITY = "quality"  # PRUNED: it ran, but its outputs drift from the baseline's beyond the budget
    #: PRUNED: its pruner stopped it, behind the study's trials at the same share of the work; its
    #: partial figure is kept (``partial_output_tokens_per_s``), and it is never the winner
    STOPPED = "stopped"
    TIMEOUT = "timeout"  # FAIL
    CRASH = "crash"  # FAIL
    INTERRUPTED = "interrupted"  # FAIL, uncounted: cut off by Ctrl-C or a dead tuner; runs again
    DUPLICATE = "duplicate"  # COMPLETE with an earlier trial's value; nothing ran, uncounted
    OVER_BUDGET = "over_budget"  # FAIL, uncounted: other workers used the budget first; nothing ran
    #: FAIL, uncounted: a lossy config proposed before the baseline's probe existed to judge it
    #: by; nothing ran, and it is queued again
    DEFERRED = "deferred"
    #: never stored: a trial failed by Optuna's heartbeat check (its worker died) has no outcome
    #: of its own, and reads as lost once its config has been queued again
    LOST = "lost"

    @classmethod
    def parse(cls, value: Any) -> Outcome | None:
        try:
            return cls(value) if value is not None else None
        except ValueError:
            return None


#: Outcomes of a config that cannot run: a failed baseline of these is final.
CANNOT_RUN = (Outcome.OOM, Outcome.INVALID)
#: Outcomes of a config that cannot be used (it cannot run, or its outputs drift too far): what
#: the feasibility model learns from.
INFEASIBLE = (*CANNOT_RUN, Outcome.QUALITY)


class Role(str, enum.Enum):
    """Where a trial's config came from."""

    BASELINE = "baseline"  # vLLM's defaults under the study's fixed args: the reference
    ENQUEUED = "enqueued"  # given by the user (--enqueue), measured exactly as written
    #: derived from the baseline's measurement before the sampler's first proposal (the batch
    #: its KV cache holds, vLLM's throughput mode), measured exactly as written
    INFORMED = "informed"
    SAMPLED = "sampled"  # proposed by the sampler


#: ``error_type`` of a config a constraint of the space ruled out (never launched)
CONSTRAINT = "constraint"
#: error types of trials that did not use up the budget: never launched (a constraint, or started
#: by a worker after the budget was used up elsewhere), or cut off by the user
UNCOUNTED = (CONSTRAINT, Outcome.INTERRUPTED.value, Outcome.OVER_BUDGET.value, Outcome.DEFERRED.value)


class _HasUserAttrs(Protocol):
    @property
    def user_attrs(self) -> dict[str, Any]: ...


class _Writable(Protocol):
    def set_user_attr(self, key: str, value: Any) -> None: ...


#: the user-attribute key of each field whose key is not its own name (kept from earlier releases)
_KEYS = {
    "role": "autotune_role",
    "config": "autotune_config",
    "retry_of": "autotune_retry_of",
    "retry_reason": "autotune_retry_reason",
    "duplicate_of": "autotune_duplicate_of",
    "validates": "autotune_validates",
    "validation_round": "autotune_validation_round",
}
ROLE_ATTR = _KEYS["role"]
RETRY_ATTR = _KEYS["retry_of"]
RETRY_REASON_ATTR = _KEYS["retry_reason"]
DUPLICATE_ATTR = _KEYS["duplicate_of"]
VALIDATES_ATTR = _KEYS["validates"]
#: fields only ``result.json`` holds (the process that ran); the study keeps the rest
_FILE_ONLY = ("returncode", "pid", "stdout")


@dataclass(frozen=True)
class TrialRecord:
    """Everything known about one trial; every field is optional until the trial reaches it.

    Attributes:
        outcome: How it ended (None while it runs).
        error_type: A short class of the failure (``oom``, ``timeout``, ``constraint``, ...).
        error: The failure in words: vLLM's message, whole.
        metrics: What a successful trial measured (``output_tokens_per_s``, ``generate_s``, ...).
        telemetry: NVML samples of its GPUs (stored inside ``metrics`` in the study).
        engine: The config vLLM resolved (KV cache size, block size, ...).
        quality: Its quality probe against the baseline's (see :class:`autotune.trial.probe.Quality`),
            with the budget it was judged by (``budget``; None: not judged), or ``probe_error``:
            why a measured trial's probe was not written.
        startup: What its engine start spent its time on, from vLLM's log (see
            :func:`autotune.trial.startup.parse_startup`): ``load_s``, ``compile_s``,
            ``cudagraph_s``, ``init_engine_s``, ``compile_cache`` (hit, miss, partial, load_failed).
        wall_s: Seconds from process start to its end.
        phases_s: Seconds after the start at which each phase began (see the protocol).
        engine_kwargs: ``LLM(**engine_kwargs)`` as run, the model included.
        trial_dir: The directory with its spec, logs and ``result.json``.
        log: The log to read when it failed (its stderr).
        gpus: NVML indices of the GPUs it ran on.
        machine: Where it ran (:func:`autotune.trial.telemetry.machine`): ``host`` and its GPUs'
            ``gpu_uuids``; empty in trials of earlier releases.
        role: Where its config came from.
        config: An enqueued config exactly as the user gave it.
        retry_of: The trial it runs again (that one was cut off or timed out cold).
        retry_reason: Why that trial runs again.
        duplicate_of: The earlier trial whose measurement answers this one (nothing ran).
        validates: In a validation study: the search trial whose config this measures again.
        validation_round: In a validation study: the round this measurement belongs to.
        returncode: The worker's exit status (``result.json`` only).
        pid: The worker's PID, also its process group (``result.json`` only).
        stdout: The worker's stdout log (``result.json`` only).
    """

    outcome: Outcome | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    error_type: str | None = None
    error: str | None = None
    telemetry: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    quality: dict[str, Any] = field(default_factory=dict)
    startup: dict[str, Any] = field(default_factory=dict)
    wall_s: float | None = None
    phases_s: dict[str, float] = field(default_factory=dict)
    engine_kwargs: dict[str, Any] | None = None
    trial_dir: str | None = None
    log: str | None = None
    gpus: tuple[int, ...] = ()
    machine: dict[str, Any] = field(default_factory=dict)
    role: Role = Role.SAMPLED
    config: dict[str, Any] | None = None
    retry_of: int | None = None
    retry_reason: str | None = None
    duplicate_of: int | None = None
    validates: int | None = None
    validation_round: int | None = None
    returncode: int | None = None
    pid: int | None = None
    stdout: str | None = None

    # -- reading ----------------------------------------------------------------------------------

    @classmethod
    def of(cls, trial: _HasUserAttrs) -> TrialRecord:
        """The record of an Optuna trial (frozen or live)."""
        return cls.from_attrs(trial.user_attrs)

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> TrialRecord:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            key = _KEYS.get(f.name, f.name)
            if key in attrs and attrs[key] is not None:
                values[f.name] = attrs[key]
        metrics = dict(values.get("metrics") or {})
        if "telemetry" in metrics and "telemetry" not in values:
            values["telemetry"] = metrics.pop("telemetry")
        metrics.pop("telemetry", None)
        values["metrics"] = metrics
        values["outcome"] = Outcome.parse(values.get("outcome"))
        try:
            values["role"] = Role(values.get("role", Role.SAMPLED.value))
        except ValueError:
            values["role"] = Role.SAMPLED
        values["gpus"] = tuple(values.get("gpus") or ())
        for name in ("retry_of", "duplicate_of", "validates", "validation_round"):
            if name in values:
                values[name] = int(values[name])
        return cls(**values)

    @classmethod
    def read_json(cls, path: str | Path) -> TrialRecord:
        """A trial directory's ``result.json``."""
        return cls.from_attrs(json.loads(Path(path).read_text(encoding="utf-8")))

    # -- what it says -----------------------------------------------------------------------------

    @property
    def counted(self) -> bool:
        """Whether it used up the study's budget (a repeat, a skip or a cut-off trial did not)."""
        return self.error_type not in UNCOUNTED and self.duplicate_of is None

    @property
    def over_budget(self) -> bool:
        """Started after other workers used up the budget: nothing ran."""
        return self.error_type == Outcome.OVER_BUDGET.value

    @property
    def set_aside(self) -> bool:
        """Nothing ran, and the config was given back: over the budget, or deferred (a lossy
        config waiting for the baseline's probe)."""
        return self.error_type in (Outcome.OVER_BUDGET.value, Outcome.DEFERRED.value)

    @property
    def launched(self) -> bool:
        """An engine was (or is being) started for it: not a skip, a repeat, or set aside."""
        return not (self.skipped or self.set_aside or self.duplicate_of is not None)

    @property
    def skipped(self) -> bool:
        """A config a constraint of the space ruled out: no engine ever started."""
        return self.error_type == CONSTRAINT

    @property
    def queued(self) -> bool:
        """Its config came from the queue (baseline, enqueued, a retry, a validation round), not
        from the sampler."""
        return self.role is not Role.SAMPLED or self.retry_of is not None or self.validates is not None

    def same_device(self, other: TrialRecord) -> bool | None:
        """Whether it ran on the same device as ``other``: the same GPUs where both know theirs,
        the same host where neither ran on a GPU NVML could name; None where that is unknown."""
        mine, theirs = self.machine.get("gpu_uuids"), other.machine.get("gpu_uuids")
        if mine and theirs:
            return sorted(mine) == sorted(theirs)
        if mine or theirs:
            return None
        host, other_host = self.machine.get("host"), other.machine.get("host")
        return host == other_host if host and other_host else None

    def elsewhere_than(self, other: TrialRecord | None) -> bool:
        """Known to have run on another device than ``other``: False where either is unknown."""
        return other is not None and self.same_device(other) is False

    def slot(self, **changes: Any) -> TrialRecord:
        """What identifies the config of a queued trial (its role, an enqueued config, the
        validation slot), with ``changes``: the record to queue it again with."""
        same = TrialRecord(
            role=self.role,
            config=self.config,
            validates=self.validates,
            validation_round=self.validation_round,
            retry_of=self.retry_of,
            retry_reason=self.retry_reason,
        )
        return dataclasses.replace(same, **changes)

    def phase_durations(self) -> dict[str, float]:
        """Seconds each phase of the worker took (see :mod:`autotune.trial.protocol`), in order:
        ``start`` (before its first event) and the last phase to the process's end included."""
        at = self.phases_s
        seen = sorted(at, key=lambda p: at[p])
        if not seen or self.wall_s is None:
            return {}
        out = {"start": at[seen[0]]}
        for phase, following in zip(seen, [*seen[1:], None], strict=True):
            end = at[following] if following is not None else self.wall_s
            out[phase] = max(0.0, end - at[phase])
        return out

    # -- writing ----------------------------------------------------------------------------------

    def attrs(self) -> dict[str, Any]:
        """The fields set on this record, as the trial's user attributes.

        ``returncode``, ``pid`` and ``stdout`` stay in ``result.json``; ``telemetry`` is stored
        inside ``metrics`` (where studies have always kept it), so only a trial with metrics
        stores it in the study, and ``result.json`` has every trial's.
        """
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in _FILE_ONLY or f.name == "telemetry":
                continue
            value = getattr(self, f.name)
            if (
                value is None
                or value == f.default
                or (f.default_factory is not dataclasses.MISSING and not value)
            ):
                continue
            out[_KEYS.get(f.name, f.name)] = _plain(value)
        if self.queued:  # a trial from the queue states its role, sampled ones included
            out[ROLE_ATTR] = self.role.value
        if self.telemetry and "metrics" in out:
            out["metrics"] = {**out["metrics"], "telemetry": self.telemetry}
        return out

    def write(self, trial: _Writable) -> None:
        """Store the fields set on this record on ``trial`` (others it has are kept)."""
        for key, value in self.attrs().items():
            trial.set_user_attr(key, value)

    def to_json(self) -> dict[str, Any]:
        """Every field of the trial itself, for ``result.json``; the study's bookkeeping (role,
        retries, repeats) is the study's to keep."""
        return {
            f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in _KEYS
        }

    def write_json(self, path: str | Path) -> None:
        """Write ``result.json`` atomically."""
        from autotune.atomic import write_json_atomic

        write_json_atomic(path, self.to_json())


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


def mark(trial: _Writable, outcome: Outcome, error: str, error_type: str | None = None) -> None:
    """Record a bookkeeping outcome (interrupted, over budget, a constraint skip) on ``trial``."""
    TrialRecord(outcome=outcome, error_type=error_type or outcome.value, error=error).write(trial)
