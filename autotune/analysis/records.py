"""A study's trials as rows for people and models: each trial's outcome, value, speedup and the
engine args it ran with, vLLM's resolved defaults filled in where it searched nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.analysis.quality import quality_of
from autotune.study.objectives import primary_value
from autotune.study.settings import raw_settings
from autotune.study.slo import misses
from autotune.study.trials import baseline_trial, ratio
from autotune.trial.record import Outcome, Role, TrialRecord

if TYPE_CHECKING:
    import optuna

#: Engine args whose name in vLLM's resolved config (the record's ``engine``) differs.
ENGINE_ALIASES = {"kv_cache_dtype": "cache_dtype"}


def resolved_value(trial: optuna.trial.FrozenTrial, name: str, defaults: dict[str, Any] | None = None) -> Any:
    """The value engine arg ``name`` had in ``trial``; None when nothing records it.

    In order: the trial's searched params, the engine kwargs it was started with, the config vLLM
    resolved for it (the record's ``engine``), then ``defaults`` (the baseline's resolved config,
    i.e. vLLM's default under the study's fixed args).
    """
    if name in trial.params:
        return trial.params[name]
    record = TrialRecord.of(trial)
    kwargs = record.engine_kwargs or {}
    if name in kwargs:
        return kwargs[name]
    alias = ENGINE_ALIASES.get(name, name)
    if alias in record.engine:
        return record.engine[alias]
    return (defaults or {}).get(alias)


def baseline_engine(study: optuna.Study) -> dict[str, Any]:
    """The config vLLM resolved for the baseline: its defaults under the study's fixed args."""
    base = baseline_trial(study)
    return dict(TrialRecord.of(base).engine) if base is not None else {}


def searched_names(study: optuna.Study) -> list[str]:
    """Parameters of the stored space, then any other parameter a trial searched (older spaces)."""
    names = list((raw_settings(study).get("space") or {}).get("parameters") or {})
    seen = set(names)
    extra = sorted({n for t in study.get_trials(deepcopy=False) for n in t.params} - seen)
    return names + extra


#: where a measurement was taken, when it is not where vLLM's defaults were
ANOTHER_DEVICE = "measured on another GPU or machine than vLLM's defaults"
#: how far apart two devices measure one config
DEVICE_SPREAD = "two GPUs of one type differ by a few percent"
#: what is said of a ratio to vLLM's defaults measured on another device than the defaults
OTHER_DEVICE = (
    f"{ANOTHER_DEVICE}: the ratio sets two devices' figures against each other ({DEVICE_SPREAD}: a "
    "ratio far above that still stands, a small one may not); validation rounds measure both side by side"
)


@dataclass(frozen=True)
class TrialRow:
    """One trial as ``show`` and the report list it."""

    number: int
    state: str
    outcome: str
    role: str
    value: float | None
    speedup: float | None
    wall_s: float | None
    params: dict[str, Any]
    error: str | None = None
    log: str | None = None
    gpu_util_pct: float | None = None
    #: its quality statement (:func:`autotune.analysis.quality.quality_of`)
    quality: dict[str, Any] = field(default_factory=dict)
    #: serve mode: the SLOs a measured trial missed, ``{metric: measured ms}`` (it never wins)
    slo_misses: dict[str, float] = field(default_factory=dict)
    #: seconds each phase of its worker took (:meth:`TrialRecord.phase_durations`)
    phase_s: dict[str, float] = field(default_factory=dict)
    #: minutes from the study's first trial's start to this one's end (breaks between runs included)
    ended_min: float | None = None
    #: it ran on another device than the baseline (another GPU or machine; both known): its
    #: ``speedup`` sets two devices' figures against each other
    other_device: bool = False

    @property
    def log_exists(self) -> bool:
        return bool(self.log) and Path(str(self.log)).is_file()


def _log_path(record: TrialRecord) -> str | None:
    if record.log:
        return str(Path(record.log).expanduser().absolute())
    if record.trial_dir:
        return str((Path(record.trial_dir).expanduser() / "stderr.log").absolute())
    return None


def _note(
    t: optuna.trial.FrozenTrial, record: TrialRecord, again: optuna.trial.FrozenTrial | None
) -> tuple[str | None, str | None]:
    """What to say of a trial beside its own error: the outcome it reads as, and the note."""
    error = record.error
    if record.duplicate_of is not None:
        return None, f"same config as #{record.duplicate_of}: answered from it, not run again"
    if again is not None and record.outcome is None:  # failed by a heartbeat check
        reason = TrialRecord.of(again).retry_reason or "cut off"
        return Outcome.LOST.value, f"{reason}; its config ran again as #{again.number}"
    if record.retry_of is not None:
        error = f"retry of #{record.retry_of}" + (f": {error}" if error else "")
    if again is not None:  # timed out on a cold start, or interrupted
        done = "queued again" if again.state.name == "WAITING" else "ran again"
        error = f"{error or t.state.name.lower()}; its config {done} as #{again.number}"
    return None, error


def trial_rows(study: optuna.Study) -> list[TrialRow]:
    """Every trial of ``study``, in order; params are the values as run (defaults resolved)."""
    base = baseline_trial(study)
    defaults = baseline_engine(study)
    base_value = primary_value(base) if base is not None else None
    base_record = TrialRecord.of(base) if base is not None else None
    names = searched_names(study)
    settings = raw_settings(study)
    budget, fixed = settings.get("quality_budget"), (settings.get("space") or {}).get("fixed") or {}
    slos = settings.get("slos") or {}
    trials = study.get_trials(deepcopy=False)
    records = [TrialRecord.of(t) for t in trials]
    retried_by = {r.retry_of: t for t, r in zip(trials, records, strict=True) if r.retry_of is not None}
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    t0 = min(starts) if starts else None
    rows = []
    for t, record in zip(trials, records, strict=True):
        complete = t.state.name == "COMPLETE"
        lost, error = _note(t, record, retried_by.get(t.number))
        outcome = lost or (record.outcome.value if record.outcome else ("success" if complete else "-"))
        util = record.telemetry.get("mean_gpu_util_pct")
        baseline = record.role is Role.BASELINE
        params = {n: resolved_value(t, n, defaults if baseline else None) for n in names}
        if not baseline:
            # a parameter the trial did not search ran at vLLM's default: say so only if known
            params = {
                n: (v if v is not None else defaults.get(ENGINE_ALIASES.get(n, n))) for n, v in params.items()
            }
        rows.append(
            TrialRow(
                number=t.number,
                state=t.state.name,
                outcome=outcome,
                role=record.role.value,
                value=primary_value(t) if complete else None,
                speedup=ratio(primary_value(t), base_value) if complete else None,
                wall_s=record.wall_s,
                params=params,
                error=error,
                log=_log_path(record),
                gpu_util_pct=float(util) if isinstance(util, (int, float)) else None,
                quality=quality_of(record, budget, fixed),
                slo_misses=_slo_misses(t, _measured(record, records), slos),
                phase_s=record.phase_durations(),
                ended_min=(t.datetime_complete - t0).total_seconds() / 60
                if t0 is not None and t.datetime_complete is not None
                else None,
                other_device=complete and _measured(record, records).elsewhere_than(base_record),
            )
        )
    return rows


def _measured(record: TrialRecord, records: list[TrialRecord]) -> TrialRecord:
    """The record whose metrics a trial's figures are: a repeat's, the trial it repeats."""
    if record.duplicate_of is not None and 0 <= record.duplicate_of < len(records):
        return records[record.duplicate_of]
    return record


def _slo_misses(
    t: optuna.trial.FrozenTrial, measured: TrialRecord, slos: dict[str, float]
) -> dict[str, float]:
    """The SLOs a trial missed (its constraints say which), each with its measured ms
    (``measured``: the record holding its metrics); NaN for a figure the benchmark did not report."""
    return misses(measured.metrics, {k: slos[k] for k, v in t.constraints.items() if v > 0 and k in slos})
