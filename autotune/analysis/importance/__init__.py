"""What drives the objective, and what drives the OOMs: scikit-learn surrogates fitted on a study's
trials, with uncertainty, cross-checked against Optuna's fANOVA.

Two random forests share one feature table (log-scaled parameters in log space, booleans as 0/1,
numeric choices as ordinals, other categoricals one-hot):

* a **regressor** on the finished trials, objective ~ params, the baseline included (its params
  are vLLM's resolved defaults);
* a **classifier** on every trial that ran or that vLLM rejected: feasible vs infeasible (out of
  memory, or a config vLLM refuses). Trials skipped by the space's own constraints never ran and
  are left out; so are crashes and timeouts whose error does not read as either.

A parameter's importance is the drop in the held-out score (R² for the regressor, ROC AUC for the
classifier) when its columns are permuted: repeated K-fold, every prediction made by a model that
never saw the row, the permutation drawn over the whole table (a 2-row test fold permuted alone
says nothing). Mean ± sd are over repeats x permutations; the repeats run in parallel (joblib).
The model's own cross-validated score comes with it, so nobody trusts a ranking built on a model
that explains nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from autotune._logging import get_logger
from autotune.analysis.importance._fanova import compare_with_fanova, fanova_importance
from autotune.analysis.importance._format import format_table, headline
from autotune.analysis.importance._results import (
    FanovaResult,
    ImportanceReport,
    ModelImportance,
    PairImportance,
    ParamImportance,
)
from autotune.analysis.importance._surrogates import MIN_FINISHED, feasibility_model, objective_model
from autotune.analysis.importance._table import Feature, TrialTable, infeasible_kind, trial_table
from autotune.errors import AutotuneError, ImportanceError
from autotune.study.settings import raw_settings

if TYPE_CHECKING:
    import optuna

_logger = get_logger(__name__)

__all__ = [
    "FanovaResult",
    "Feature",
    "ImportanceError",
    "ImportanceReport",
    "ModelImportance",
    "PairImportance",
    "ParamImportance",
    "TrialTable",
    "compare_with_fanova",
    "compute_importance",
    "export_importance",
    "fanova_importance",
    "format_table",
    "importance_section",
    "infeasible_kind",
    "trial_table",
]


def compute_importance(
    study: optuna.Study,
    *,
    n_estimators: int = 100,
    n_repeats: int = 5,
    n_permutations: int = 3,
    seed: int = 0,
    n_jobs: int = -1,
    min_finished: int = MIN_FINISHED,
    fanova: bool = True,
) -> ImportanceReport:
    """Rank what drives a study's objective and what drives its infeasible configs.

    Args:
        study: An autotune study (any Optuna study whose trials are single-objective works).
        n_estimators: Trees per random forest.
        n_repeats: Repeats of K-fold (K = 5, fewer with fewer trials); each gives one score.
        n_permutations: Permutations per parameter and repeat.
        seed: Makes the whole computation reproducible, whatever ``n_jobs``.
        n_jobs: Repeats fitted at once (joblib threads; -1 = one per core). Results do not
            depend on it.
        min_finished: Below this many finished trials no ranking is computed.
        fanova: Also run Optuna's fANOVA and say where it disagrees.

    Returns:
        The report; models that could not be fitted say why in their ``message``.

    Raises:
        ImportanceError: scikit-learn is not installed, or the study is multi-objective.
    """
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise ImportanceError(
            "parameter importance needs scikit-learn: pip install 'scikit-learn>=1.3'"
        ) from None
    started = time.perf_counter()
    settings = raw_settings(study)
    table = trial_table(study)
    kw: dict[str, Any] = {
        "n_estimators": n_estimators,
        "n_repeats": n_repeats,
        "n_permutations": n_permutations,
        "seed": seed,
        "n_jobs": n_jobs,
    }
    regressor = objective_model(table, min_finished, study.study_name, **kw)
    classifier = feasibility_model(table, min_finished, **kw)
    fan = (
        fanova_importance(study, min_finished=min_finished, seed=seed)
        if fanova
        else FanovaResult("not_applicable", "not asked for")
    )
    regressor, rho, disagreements = compare_with_fanova(regressor, fan)
    elapsed = time.perf_counter() - started
    _logger.debug("importance of %s in %.1f s", study.study_name, elapsed)
    return ImportanceReport(
        study=study.study_name,
        objective=str(settings.get("objective", "objective")),
        objective_model=regressor,
        feasibility_model=classifier,
        fanova=fan,
        spearman_vs_fanova=rho,
        disagreements=tuple(disagreements),
        notes=table.notes,
        method={
            **{k: v for k, v in kw.items() if k != "n_jobs"},
            "importance": "drop in the held-out score when the parameter is permuted; "
            "mean ± sd over repeats x permutations",
            "encoding": {f.name: f.kind + (" (log10)" if f.log else "") for f in table.features},
        },
        elapsed_s=elapsed,
    )


def export_importance(study: optuna.Study, **kwargs: Any) -> tuple[dict[str, Any], str]:
    """:func:`compute_importance` for an export: its ``importance`` entry and a one-line summary.

    Never raises: an export must not fail because the ranking could not be computed; the entry
    then holds ``{"status": "error", "message": ...}`` and the text says the same.
    """
    try:
        report = compute_importance(study, **kwargs)
    except AutotuneError as e:
        return {"status": "error", "message": str(e)}, f"parameter importance: {e}"
    except Exception as e:  # a bug in the ranking must not cost the user their export
        _logger.warning("importance failed: %s: %s", type(e).__name__, e)
        message = f"{type(e).__name__}: {e}"
        return {"status": "error", "message": message}, f"parameter importance failed: {message}"
    return {"status": "ok", **report.to_dict()}, headline(report)


def importance_section(study: optuna.Study, **kwargs: Any) -> dict[str, Any]:
    """The ``importance`` entry of an export (see :func:`export_importance`); never raises."""
    return export_importance(study, **kwargs)[0]
