"""``autotune ls``: the studies in a storage, with trial counts, budget, best value and speedup."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune._logging import get_logger
from autotune.analysis.records import OTHER_DEVICE
from autotune.analysis.verdict import study_verdict
from autotune.errors import AutotuneError, StorageError, StudyError
from autotune.output.text import fmt, table
from autotune.study.budget import counted_trials
from autotune.study.objectives import primary_value
from autotune.study.settings import budget, raw_settings
from autotune.study.trials import baseline_trial, best_or_none, ratio
from autotune.study.validation import is_validation_study
from autotune.trial.record import TrialRecord

if TYPE_CHECKING:
    import optuna

_logger = get_logger(__name__)
_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")


@dataclass(frozen=True)
class StudySummary:
    """One line of ``autotune ls``."""

    name: str
    storage: str
    objective: str
    model: str
    counts: dict[str, int]
    n_trials: int
    budget: int | None = None
    used: int | None = None
    best_value: float | None = None
    best_trial: int | None = None
    baseline_value: float | None = None
    speedup: float | None = None
    #: the best's run and the baseline's ran on different devices: ``speedup`` compares two devices
    other_device: bool = False
    #: the verdict of its validation rounds (:meth:`~autotune.analysis.verdict.Verdict.to_dict`)
    validation: dict[str, Any] | None = None

    @property
    def validated(self) -> str:
        """The verdict in a few words: "x1.180 [1.15-1.21] (#5)", "keep defaults", "not validated"."""
        v = self.validation
        if v is None:
            return "not validated" if self.autotune else "-"
        best = next((c for c in v["candidates"] if c["trial"] == v["winner"]), None)
        if best is None or best["median"] is None:
            return "keep defaults" if v.get("keep_defaults", True) else "defaults miss an SLO"
        ci = f" [{best['ci95'][0]:.2f}-{best['ci95'][1]:.2f}]" if best["ci95"] else ""
        return f"x{best['median']:.3f}{ci} (#{best['trial']})"

    vllm: str = ""
    started: str | None = None
    autotune: bool = True


def summarize_study(study: optuna.Study, storage: str) -> StudySummary:
    """Counts by state, best value and speedup over the baseline of one study."""
    settings = raw_settings(study)
    counts = {s: 0 for s in _STATES}
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    best = best_or_none(study) if counts["COMPLETE"] else None
    base = baseline_trial(study)
    base_value = primary_value(base) if base is not None else None
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    return StudySummary(
        name=study.study_name,
        storage=storage,
        objective=str(settings.get("objective", "")),
        model=str(settings.get("model", "")),
        counts={k: v for k, v in counts.items() if v or k in ("COMPLETE", "PRUNED", "FAIL")},
        n_trials=len(trials),
        budget=budget(study) if settings else None,
        used=counted_trials(study) if settings else None,
        best_value=primary_value(best) if best is not None else None,
        best_trial=best.number if best is not None else None,
        baseline_value=base_value,
        speedup=ratio(primary_value(best), base_value) if best is not None else None,
        other_device=best is not None
        and base is not None
        and TrialRecord.of(best).elsewhere_than(TrialRecord.of(base)),
        validation=_validation(study) if settings else None,
        vllm=f"{settings.get('distribution', '')} {settings.get('vllm_version', '')}".strip(),
        started=min(starts).isoformat(timespec="seconds") if starts else None,
        autotune=bool(settings),
    )


def _validation(study: optuna.Study) -> dict[str, Any] | None:
    verdict = study_verdict(study)
    return verdict.to_dict() if verdict is not None else None


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
        for name in (n for n in names if not is_validation_study(n)):  # shown with their study
            study = optuna.load_study(study_name=name, storage=storage)
            out.append(summarize_study(study, label))
    return sorted(out, key=lambda s: (s.name, s.storage))


def format_list(summaries: Sequence[StudySummary]) -> str:
    """``autotune ls`` output: one line per study."""
    if not summaries:
        return "no studies"
    several = len({s.storage for s in summaries}) > 1
    headers = [
        "STUDY",
        "TRIALS",
        "BUDGET",
        "COMPLETE",
        "PRUNED",
        "FAIL",
        "BEST",
        "x BASELINE (1 run)",
        "VALIDATED",
        "OBJECTIVE",
        "MODEL",
    ]
    rows = []
    for s in summaries:
        best = f"{fmt(s.best_value)} (#{s.best_trial})" if s.best_value is not None else "-"
        speed = f"x{s.speedup:.3f}" if s.speedup is not None else "-"
        if s.speedup is not None and s.other_device:
            speed += " (other device)"
        counts = [str(s.counts.get(k, 0)) for k in ("COMPLETE", "PRUNED", "FAIL")]
        other = s.n_trials - sum(int(c) for c in counts)
        trials = f"{s.n_trials}" + (f" ({other} running/waiting)" if other else "")
        model = s.model if s.autotune else "(not an autotune study)"
        used = f"{s.used}/{s.budget}" if s.budget is not None else "-"
        rows.append([s.name, trials, used, *counts, best, speed, s.validated, s.objective or "-", model])
    text = table(headers, rows, right={1, 2, 3, 4, 5, 6, 7})
    if several:
        text += "\n\n" + "\n".join(f"{s.name}: {s.storage}" for s in summaries)
    if any(s.other_device and s.speedup is not None for s in summaries):
        text += f"\n\n(other device): the best's run was {OTHER_DEVICE}"
    return text
