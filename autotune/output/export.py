"""Export the winning config: engine kwargs for ``LLM(**kwargs)``, the ``vllm serve`` flags,
its metrics beside the baseline's, and where it was measured. Written atomically."""

from __future__ import annotations

import datetime as _dt
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from autotune.atomic import write_json_atomic
from autotune.errors import StudyError
from autotune.space.engine_args import EngineInfo

if TYPE_CHECKING:
    from autotune.analysis.verdict import Verdict
from autotune.study.settings import stored_settings
from autotune.study.trials import baseline_trial, best_or_none, ratio, state_counts
from autotune.trial.record import Role, TrialRecord

FORMAT_VERSION = 1


def serve_args(kwargs: dict[str, Any], engine: EngineInfo) -> list[str]:
    """``vllm serve`` arguments (after the model) equivalent to engine ``kwargs``.

    Flags come from the installed vLLM's own argument parser; booleans use its
    ``--x`` / ``--no-x`` pairs, lists its multi-value form, dicts JSON.
    """
    out: list[str] = []
    for name, value in kwargs.items():
        if name == "model" or value is None:
            continue
        info = engine.args.get(name)
        flag = info.flags[0] if info and info.flags else "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if value:
                out.append(flag)
            elif info is not None and info.boolean_optional:
                out.append("--no-" + flag[2:])
            continue
        if isinstance(value, (list, tuple)) and info is not None and info.nargs in ("+", "*"):
            out += [flag, *map(str, value)]
        elif isinstance(value, (dict, list, tuple)):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            out += [flag, str(value)]
    return out


def serve_command(kwargs: dict[str, Any], engine: EngineInfo | None = None) -> str:
    """``vllm serve MODEL ...`` for engine ``kwargs``; flag names from the installed vLLM when it
    can be described, else the usual ``--arg-name`` spelling."""
    if engine is None:
        from autotune.errors import AutotuneError
        from autotune.space.engine_args import describe_engine

        try:
            engine = describe_engine()
        except AutotuneError:
            engine = EngineInfo("", "", "")
    return shlex.join(["vllm", "serve", str(kwargs.get("model")), *serve_args(kwargs, engine)])


def build_export(
    study: optuna.Study,
    engine: EngineInfo,
    storage_url: str,
    *,
    importance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The export document for the study's best trial.

    Args:
        importance: The ``importance`` entry (:func:`autotune.analysis.importance.export_importance`);
            computed here when None.

    Raises:
        StudyError: no trial of the study completed.
    """
    from autotune.analysis.importance import importance_section
    from autotune.analysis.quality import quality_of
    from autotune.analysis.verdict import study_verdict

    settings = stored_settings(study)
    best = exportable_best(study)
    base = baseline_trial(study)
    verdict = study_verdict(study)
    if verdict is not None and verdict.rounds:
        # the validated winner; "keep vLLM's defaults": the baseline, i.e. the fixed args alone
        best = study.trials[verdict.winner] if verdict.winner is not None else (base or best)
    record = TrialRecord.of(best)
    base_record = TrialRecord.of(base) if base is not None else None
    kwargs = dict(record.engine_kwargs or {"model": settings.model})
    args = serve_args(kwargs, engine)
    return {
        "format_version": FORMAT_VERSION,
        "study": study.study_name,
        "storage": storage_url,
        "trial_number": best.number,
        "is_baseline": record.role is Role.BASELINE,
        "objective": settings.objective,
        "value": best.value,
        "engine_kwargs": kwargs,
        "vllm_serve_args": args,
        "vllm_serve_command": serve_command(kwargs, engine),
        "metrics": _metrics(record),
        "resolved_engine_config": record.engine,
        "baseline": None
        if base is None or base_record is None
        else {
            "trial_number": base.number,
            "value": base.value,
            "metrics": _metrics(base_record),
            "resolved_engine_config": base_record.engine,
        },
        "speedup_over_baseline": _speedup(best, base, verdict),
        "validation": _validation(verdict),
        # what the winner does to the model's outputs: measured against the baseline, or named
        "quality": quality_of(record, settings.quality_budget, settings.fixed),
        "model": settings.model,
        "workload": settings.workload,
        "search_space": settings.space,
        "vllm_version": settings.vllm_version,
        "vllm_distribution": settings.distribution,
        "platform": settings.platform,
        "gpu": {"names": settings.gpus, "count": len(settings.gpus)},
        "trials": state_counts(study),
        "importance": importance if importance is not None else importance_section(study),
        "exported_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _speedup(
    best: optuna.trial.FrozenTrial, base: optuna.trial.FrozenTrial | None, verdict: Verdict | None
) -> float | None:
    """The validated speedup when there is one; else the single search measurement's ratio."""
    if verdict is not None and verdict.rounds:
        return float(verdict.to_dict()["speedup"])
    return ratio(best.value, base.value if base is not None else None)


def _validation(verdict: Verdict | None) -> dict[str, Any]:
    if verdict is None:
        return {
            "status": "not validated",
            "message": "the speedup is one measurement of each config; `autotune validate` measures the "
            "best again in rounds beside vLLM's defaults",
        }
    return {"status": "validated", **verdict.to_dict()}


def exportable_best(study: optuna.Study) -> optuna.trial.FrozenTrial:
    """The trial an export is of.

    Raises:
        StudyError: no trial of the study completed.
    """
    best = best_or_none(study)
    if best is None:
        raise StudyError(
            f"study {study.study_name!r} has no completed trial to export yet; run "
            f"`autotune run --study {study.study_name}` first"
        )
    return best


def _metrics(record: TrialRecord) -> dict[str, Any]:
    """A trial's metrics as exports have always shown them: its telemetry inside."""
    return (
        {**record.metrics, "telemetry": record.telemetry}
        if record.metrics and record.telemetry
        else record.metrics
    )


def write_export(doc: dict[str, Any], out: str | Path) -> Path:
    path = Path(out)
    write_json_atomic(path, doc)
    return path
