"""Reading studies for people: ``autotune ls`` (the studies in a storage, with trial counts, best
value and speedup) and ``autotune show`` (one study's settings, best vs baseline, its trials).

Also the per-trial rows and resolved parameter values that the HTML report and the importance
surrogates share.
"""

from __future__ import annotations

import dataclasses
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune._logging import get_logger
from autotune.errors import AutotuneError, StorageError, StudyError
from autotune.study.lifecycle import (
    DUPLICATE_ATTR,
    RETRY_ATTR,
    RETRY_REASON_ATTR,
    ROLE_ATTR,
    SETTINGS_ATTR,
    baseline_trial,
    best_trial,
)

if TYPE_CHECKING:
    import optuna

_logger = get_logger(__name__)

#: Engine args whose name in vLLM's resolved config (the ``engine`` user attr) differs.
ENGINE_ALIASES = {"kv_cache_dtype": "cache_dtype"}
_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")


def ratio(value: float | None, reference: float | None) -> float | None:
    """``value / reference``; None when either is missing or the reference is 0."""
    return value / reference if value is not None and reference else None


# ---------------------------------------------------------------------------------------------
# trials


def resolved_value(trial: optuna.trial.FrozenTrial, name: str, defaults: dict[str, Any] | None = None) -> Any:
    """The value engine arg ``name`` had in ``trial``; None when nothing records it.

    In order: the trial's searched params, the engine kwargs it was started with, the config vLLM
    resolved for it (user attr ``engine``), then ``defaults`` (the baseline's resolved config,
    i.e. vLLM's default under the study's fixed args).
    """
    if name in trial.params:
        return trial.params[name]
    kwargs = trial.user_attrs.get("engine_kwargs") or {}
    if name in kwargs:
        return kwargs[name]
    alias = ENGINE_ALIASES.get(name, name)
    engine = trial.user_attrs.get("engine") or {}
    if alias in engine:
        return engine[alias]
    return (defaults or {}).get(alias)


def searched_names(study: optuna.Study) -> list[str]:
    """Parameters of the stored space, then any other parameter a trial searched (older spaces)."""
    settings = study.user_attrs.get(SETTINGS_ATTR) or {}
    names = list((settings.get("space") or {}).get("parameters") or {})
    seen = set(names)
    extra = sorted({n for t in study.get_trials(deepcopy=False) for n in t.params} - seen)
    return names + extra


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

    @property
    def log_exists(self) -> bool:
        return bool(self.log) and Path(str(self.log)).is_file()


def _log_path(trial: optuna.trial.FrozenTrial) -> str | None:
    log = trial.user_attrs.get("log")
    if log:
        return str(Path(str(log)).expanduser().absolute())
    trial_dir = trial.user_attrs.get("trial_dir")
    if trial_dir:
        return str((Path(str(trial_dir)).expanduser() / "stderr.log").absolute())
    return None


def trial_rows(study: optuna.Study) -> list[TrialRow]:
    """Every trial of ``study``, in order; params are the values as run (defaults resolved)."""
    base = baseline_trial(study)
    defaults = dict(base.user_attrs.get("engine") or {}) if base is not None else {}
    base_value = base.value if base is not None else None
    names = searched_names(study)
    trials = study.get_trials(deepcopy=False)
    retried_by = {t.user_attrs[RETRY_ATTR]: t for t in trials if RETRY_ATTR in t.user_attrs}
    rows = []
    for t in trials:
        attrs = t.user_attrs
        outcome = str(attrs.get("outcome") or ("success" if t.state.name == "COMPLETE" else "-"))
        error = attrs.get("error")
        if DUPLICATE_ATTR in attrs:
            error = f"same config as #{attrs[DUPLICATE_ATTR]}: answered from it, not run again"
        elif t.number in retried_by and "outcome" not in attrs:  # failed by a heartbeat check
            again = retried_by[t.number]
            outcome = "lost"
            reason = again.user_attrs.get(RETRY_REASON_ATTR, "cut off")
            error = f"{reason}; its config ran again as #{again.number}"
        else:
            if RETRY_ATTR in attrs:
                error = f"retry of #{attrs[RETRY_ATTR]}" + (f": {error}" if error else "")
            if t.number in retried_by:  # timed out on a cold start, or interrupted
                again = retried_by[t.number]
                done = "queued again" if again.state.name == "WAITING" else "ran again"
                error = f"{error or t.state.name.lower()}; its config {done} as #{again.number}"
        telemetry = (attrs.get("metrics") or {}).get("telemetry") or {}
        util = telemetry.get("mean_gpu_util_pct")
        role = str(attrs.get(ROLE_ATTR) or "sampled")
        params = {n: resolved_value(t, n, defaults if role == "baseline" else None) for n in names}
        if role != "baseline":
            # a parameter the trial did not search ran at vLLM's default: say so only if known
            params = {
                n: (v if v is not None else defaults.get(ENGINE_ALIASES.get(n, n))) for n, v in params.items()
            }
        rows.append(
            TrialRow(
                number=t.number,
                state=t.state.name,
                outcome=outcome,
                role=role,
                value=t.value if t.state.name == "COMPLETE" else None,
                speedup=ratio(t.value, base_value) if t.state.name == "COMPLETE" else None,
                wall_s=attrs.get("wall_s"),
                params=params,
                error=error,
                log=_log_path(t),
                gpu_util_pct=float(util) if isinstance(util, (int, float)) else None,
            )
        )
    return rows


# ---------------------------------------------------------------------------------------------
# ls


@dataclass(frozen=True)
class StudySummary:
    """One line of ``autotune ls``."""

    name: str
    storage: str
    objective: str
    model: str
    counts: dict[str, int]
    n_trials: int
    best_value: float | None = None
    best_trial: int | None = None
    baseline_value: float | None = None
    speedup: float | None = None
    vllm: str = ""
    started: str | None = None
    autotune: bool = True


def summarize_study(study: optuna.Study, storage: str) -> StudySummary:
    """Counts by state, best value and speedup over the baseline of one study."""
    settings = study.user_attrs.get(SETTINGS_ATTR)
    counts = {s: 0 for s in _STATES}
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    best = None
    if counts["COMPLETE"] and len(study.directions) == 1:
        try:
            best = best_trial(study)
        except ValueError:
            best = None
    base = baseline_trial(study)
    base_value = base.value if base is not None else None
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    return StudySummary(
        name=study.study_name,
        storage=storage,
        objective=str(settings.get("objective", "")) if isinstance(settings, dict) else "",
        model=str(settings.get("model", "")) if isinstance(settings, dict) else "",
        counts={k: v for k, v in counts.items() if v or k in ("COMPLETE", "PRUNED", "FAIL")},
        n_trials=len(trials),
        best_value=best.value if best is not None else None,
        best_trial=best.number if best is not None else None,
        baseline_value=base_value,
        speedup=ratio(best.value, base_value) if best is not None else None,
        vllm=(
            f"{settings.get('distribution', '')} {settings.get('vllm_version', '')}".strip()
            if isinstance(settings, dict)
            else ""
        ),
        started=min(starts).isoformat(timespec="seconds") if starts else None,
        autotune=isinstance(settings, dict),
    )


def is_optuna_sqlite(path: Path) -> bool:
    """Whether ``path`` is an SQLite file holding Optuna's tables (read-only check).

    Opening any other file through Optuna's storage would create its tables in it.
    """
    try:
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as con:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        con.close()
    except sqlite3.Error:
        return False
    return {"studies", "trials", "version_info"} <= names


def storage_urls(storage: str | None, studies_dir: Path) -> list[str]:
    """The storages ``ls`` reads: ``storage`` when given, else every Optuna ``*.db`` in ``studies_dir``.

    Raises:
        StudyError: no storage given and ``studies_dir`` holds no study database.
    """
    if storage is not None:
        return [storage]
    if not studies_dir.is_dir():
        raise StudyError(
            f"no directory {studies_dir}/: give --studies-dir where your studies live, or --storage URL"
        )
    dbs = sorted(p for p in studies_dir.glob("*.db") if p.is_file() and is_optuna_sqlite(p))
    if not dbs:
        raise StudyError(
            f"no study database (*.db) in {studies_dir}/: give --studies-dir where your studies live, "
            "or --storage URL"
        )
    return [f"sqlite:///{p}" for p in dbs]


def list_studies(urls: Sequence[str]) -> list[StudySummary]:
    """Summaries of every study in the storages ``urls``, by name.

    Raises:
        StorageError: a storage cannot be opened (a single explicit ``--storage``).
    """
    import optuna

    from autotune.study.storage import open_storage, redact

    out: list[StudySummary] = []
    for url in urls:
        label = redact(url)
        try:
            storage = open_storage(url)
            names = optuna.study.get_all_study_names(storage)
        except (AutotuneError, RuntimeError) as e:
            if len(urls) == 1:
                raise StorageError(f"{label}: {e}") from None
            _logger.warning("skipping %s: %s", label, e)
            continue
        for name in names:
            study = optuna.load_study(study_name=name, storage=storage)
            out.append(summarize_study(study, label))
    return sorted(out, key=lambda s: (s.name, s.storage))


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and abs(value) < 0.01:
            return f"{value:.3g}"
        if value == int(value) and abs(value) >= 1000:
            return f"{int(value):,}"
        return f"{value:,.{digits}f}" if abs(value) >= 100 else f"{value:.{max(digits, 3)}g}"
    return str(value)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int] | None = None) -> str:
    """A plain-text table; columns in ``right`` are right-aligned."""
    right = right or set()
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in pairs]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def format_list(summaries: Sequence[StudySummary]) -> str:
    """``autotune ls`` output: one line per study."""
    if not summaries:
        return "no studies"
    several = len({s.storage for s in summaries}) > 1
    headers = ["STUDY", "TRIALS", "COMPLETE", "PRUNED", "FAIL", "BEST", "x BASELINE", "OBJECTIVE", "MODEL"]
    rows = []
    for s in summaries:
        best = f"{_fmt(s.best_value)} (#{s.best_trial})" if s.best_value is not None else "-"
        speed = f"x{s.speedup:.3f}" if s.speedup is not None else "-"
        counts = [str(s.counts.get(k, 0)) for k in ("COMPLETE", "PRUNED", "FAIL")]
        other = s.n_trials - sum(int(c) for c in counts)
        trials = f"{s.n_trials}" + (f" ({other} running/waiting)" if other else "")
        model = s.model if s.autotune else "(not an autotune study)"
        rows.append([s.name, trials, *counts, best, speed, s.objective or "-", model])
    text = _table(headers, rows, right={1, 2, 3, 4, 5, 6})
    if several:
        text += "\n\n" + "\n".join(f"{s.name}: {s.storage}" for s in summaries)
    return text


# ---------------------------------------------------------------------------------------------
# show


def open_study(name: str, storage: str | None, studies_dir: Path) -> tuple[optuna.Study, str]:
    """Load an existing study the way ``autotune export`` finds it.

    Returns:
        ``(study, redacted storage URL)``.

    Raises:
        StudyError: no such study (the message says where it looked and how to point elsewhere).
    """
    from autotune.study.lifecycle import load_existing
    from autotune.study.storage import check_study_name, default_url, open_storage, redact

    name = check_study_name(name)
    url = storage or default_url(name, studies_dir)
    if storage is None and not (studies_dir / f"{name}.db").is_file():
        raise StudyError(
            f"no study {name!r} in {studies_dir}/ (give --studies-dir, or --storage if it lives elsewhere; "
            f"`autotune ls --studies-dir DIR` lists what is there)"
        )
    study = load_existing(name, open_storage(url))
    if study is None:
        raise StudyError(f"no study named {name!r} in {redact(url)} (`autotune ls --storage URL` lists them)")
    return study, redact(url)


def _describe_param(name: str, spec: dict[str, Any]) -> str:
    from autotune.space.load import ParamSpec

    try:
        p = ParamSpec(
            name=name,
            type=spec.get("type", "categorical"),
            low=spec.get("low"),
            high=spec.get("high"),
            log=bool(spec.get("log", False)),
            step=spec.get("step"),
            choices=tuple(spec.get("choices") or ()),
        )
        return f"{name} {p.describe()}"
    except (TypeError, ValueError):
        return f"{name} {spec}"


def show_doc(study: optuna.Study, storage: str = "") -> dict[str, Any]:
    """One study as a JSON-able dict: settings, best vs baseline, trials."""
    from autotune.trial.workload import WorkloadSpec

    settings = study.user_attrs.get(SETTINGS_ATTR) or {}
    summary = summarize_study(study, storage)
    rows = trial_rows(study)
    space = settings.get("space") or {}
    wl = settings.get("workload") or {}
    try:
        fields = {f.name for f in dataclasses.fields(WorkloadSpec)}
        workload = WorkloadSpec(**{k: v for k, v in wl.items() if k in fields}).describe()
    except (TypeError, ValueError):
        workload = str(wl)
    by_number = {r.number: r for r in rows}
    best = by_number.get(summary.best_trial) if summary.best_trial is not None else None
    base = baseline_trial(study)
    base_row = by_number.get(base.number) if base is not None else None
    comparison = []
    if best is not None:
        for n in best.params:
            comparison.append(
                {
                    "parameter": n,
                    "baseline": base_row.params.get(n) if base_row is not None else None,
                    "best": best.params.get(n),
                }
            )
    return {
        "study": study.study_name,
        "storage": storage,
        "autotune": summary.autotune,
        "model": settings.get("model"),
        "workload": workload,
        "objective": settings.get("objective"),
        "direction": study.direction.name.lower() if len(study.directions) == 1 else "multi",
        "vllm": summary.vllm,
        "platform": settings.get("platform"),
        "gpus": settings.get("gpus") or [],
        "fixed": space.get("fixed") or {},
        "searching": [_describe_param(n, s) for n, s in (space.get("parameters") or {}).items()],
        "constraints": space.get("constraints") or [],
        "counts": summary.counts,
        "best": None
        if best is None
        else {"trial": best.number, "value": best.value, "speedup_over_baseline": best.speedup},
        "baseline": None if base_row is None else {"trial": base_row.number, "value": base_row.value},
        "best_vs_baseline": comparison,
        "trials": [dataclasses.asdict(r) for r in rows],
    }


def _short(text: str | None, n: int = 90) -> str:
    if not text:
        return ""
    one = " ".join(str(text).split())
    return one if len(one) <= n else one[: n - 3] + "..."


def format_show(doc: dict[str, Any]) -> str:
    """``autotune show`` output for a :func:`show_doc` document."""
    gpus = doc["gpus"]
    gpu_text = f", {len(gpus)} x {gpus[0]}" if gpus else ""
    counts = ", ".join(f"{v} {k.lower()}" for k, v in doc["counts"].items() if v)
    lines = [
        f"Study {doc['study']}" + (f"  ({doc['storage']})" if doc["storage"] else ""),
        f"  model        {doc['model'] or '-'}",
        f"  workload     {doc['workload']}",
        f"  objective    {doc['objective'] or '-'} ({doc['direction']})",
        f"  vLLM         {doc['vllm'] or '-'} on {doc['platform'] or '?'}{gpu_text}",
        f"  fixed        {', '.join(f'{k}={_fmt(v)}' for k, v in doc['fixed'].items()) or '-'}",
        f"  searching    {(chr(10) + ' ' * 15).join(doc['searching']) or '-'}",
    ]
    if doc["constraints"]:
        lines.append(f"  constraints  {'; '.join(doc['constraints'])}")
    lines.append(f"  trials       {sum(doc['counts'].values())}: {counts or 'none'}")
    lines.append("")
    best, base = doc["best"], doc["baseline"]
    if best is None:
        lines.append("No completed trial yet.")
    else:
        line = f"Best: trial #{best['trial']}, {_fmt(best['value'])} {doc['objective'] or ''}".rstrip()
        if base is not None and best["speedup_over_baseline"] is not None:
            speed = best["speedup_over_baseline"]
            line += f", x{speed:.3f} over vLLM's defaults (trial #{base['trial']}, {_fmt(base['value'])})"
        elif base is None:
            line += " (no completed baseline to compare with)"
        lines.append(line)
        if doc["best_vs_baseline"]:
            rows = [
                [
                    c["parameter"],
                    _fmt(c["baseline"]),
                    _fmt(c["best"]),
                    "" if c["baseline"] == c["best"] else "*",
                ]
                for c in doc["best_vs_baseline"]
            ]
            lines.append(_indent(_table(["parameter", "vLLM default", "best", "changed"], rows)))
    lines += ["", "Trials"]
    rows = []
    for r in doc["trials"]:
        note = _short(r["error"]) if r["error"] else ""
        if r["role"] != "sampled":
            note = f"[{r['role']}] {note}".strip()
        rows.append(
            [
                str(r["number"]),
                r["state"],
                r["outcome"],
                _fmt(r["value"]),
                f"x{r['speedup']:.3f}" if r["speedup"] is not None else "",
                f"{r['wall_s']:.0f}s" if isinstance(r["wall_s"], (int, float)) else "",
                note,
            ]
        )
    lines.append(
        _indent(_table(["#", "state", "outcome", "value", "x base", "wall", "note"], rows, {0, 3, 4, 5}))
    )
    return "\n".join(lines)


def _indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line for line in text.splitlines())


__all__ = [
    "ENGINE_ALIASES",
    "StudySummary",
    "TrialRow",
    "format_list",
    "format_show",
    "is_optuna_sqlite",
    "list_studies",
    "open_study",
    "resolved_value",
    "searched_names",
    "show_doc",
    "storage_urls",
    "summarize_study",
    "trial_rows",
]
