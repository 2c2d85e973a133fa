"""The quality guard, parent side: which probe a trial scores, and whether its drift is allowed.

The baseline's worker writes the reference probe (the workload's first prompts and its own
greedy continuations, scored); every later trial scores the same sequences, and
:func:`judge` compares the two (:func:`autotune.trial.probe.compare`). A trial whose mean KL
divergence exceeds the study's quality budget is PRUNED with ``error_type=quality``: it keeps
its measured speed, so a report can show what the drift would have bought, but it never wins.
A config with a lossy argument that could not be compared (no reference probe) is pruned too:
a lossy config never wins unmeasured.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import optuna

from autotune._logging import get_logger
from autotune.study.trials import baseline_trial
from autotune.trial.probe import PROBE_FILE, ProbeMismatch, compare, read_probe
from autotune.trial.record import Outcome, Role, TrialRecord

_logger = get_logger(__name__)

QUALITY = Outcome.QUALITY.value


@dataclasses.dataclass(frozen=True)
class Reference:
    """The baseline trial whose probe every other trial is compared with."""

    trial: int
    path: Path


def reference(study: optuna.Study) -> Reference | None:
    """The completed baseline's probe, if it wrote one."""
    base = baseline_trial(study)
    if base is None:
        return None
    trial_dir = TrialRecord.of(base).trial_dir
    path = Path(trial_dir) / PROBE_FILE if trial_dir else None
    return Reference(base.number, path) if path is not None and path.is_file() else None


def _baseline_pending(study: optuna.Study) -> bool:
    """The baseline has not finished yet (it is queued or running in another worker)."""
    pending = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    return baseline_trial(study) is None and any(
        TrialRecord.of(t).role is Role.BASELINE for t in study.get_trials(deepcopy=False, states=pending)
    )


def plan(trial: optuna.Trial, wait_s: float) -> tuple[dict[str, Any], Reference | None]:
    """The probe ``trial``'s worker runs, and the reference it is judged against.

    The baseline writes the reference; any other trial scores the reference's sequences, waiting
    up to ``wait_s`` for a baseline that another worker is still running.
    """
    if TrialRecord.of(trial).role is Role.BASELINE:
        return {}, None
    deadline = time.monotonic() + wait_s
    while _baseline_pending(trial.study) and time.monotonic() < deadline:
        time.sleep(2.0)
    ref = reference(trial.study)
    return ({"reference": str(ref.path)} if ref is not None else {}), ref


def judge(result: TrialRecord, ref: Reference | None, budget: float, lossy: list[str]) -> TrialRecord:
    """``result`` with its quality against ``ref``; PRUNED (``quality``) when over ``budget``."""
    if result.outcome is not Outcome.SUCCESS:
        return result
    probe = Path(result.trial_dir or ".") / PROBE_FILE
    why = None
    if ref is None:
        why = "no baseline probe exists to compare it with (the baseline's probe failed: see its log)"
    elif not probe.is_file():
        cause = result.metrics.get("probe_error") or f"see {result.log or 'its log'}"
        why = f"its probe wrote nothing ({cause})"
    else:
        try:
            quality = compare(read_probe(ref.path), read_probe(probe), ref.trial)
        except (ProbeMismatch, OSError, ValueError, KeyError) as e:
            why = f"its probe does not compare with the baseline's ({e})"
        else:
            stated = {**quality.to_dict(), "budget": budget}
            if quality.kl_mean <= budget:
                return dataclasses.replace(result, quality=stated)
            return dataclasses.replace(
                result,
                outcome=Outcome.QUALITY,
                error_type=QUALITY,
                error=(
                    f"its outputs drift from the baseline's beyond the quality budget: mean KL "
                    f"{quality.kl_mean:.4f} > {budget:g} nats per token, top-1 agreement "
                    f"{quality.top1:.1%} over {quality.positions} positions"
                    + (f" ({', '.join(lossy)})" if lossy else "")
                ),
                quality=stated,
            )
    if not lossy:
        _logger.warning("trial quality not measured: %s", why)
        return result
    return dataclasses.replace(
        result,
        outcome=Outcome.QUALITY,
        error_type=QUALITY,
        error=f"{', '.join(lossy)} changes the model's outputs, and {why}",
    )
