"""The quality guard, parent side: which probe a trial scores, and whether its drift is allowed.

The baseline's worker writes the reference probe (the workload's first prompts and its own
greedy continuations, scored), which the study keeps (:mod:`autotune.study.reference`); every
later trial scores the same sequences, and :func:`judge` compares the two
(:func:`autotune.trial.probe.compare`). A lossy config proposed before the baseline finished
waits for it: it is queued again, uncounted (:data:`AWAITING_BASELINE`). A trial whose mean KL
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
from autotune.atomic import write_json_atomic
from autotune.study.reference import StoredReference, store_reference, stored_reference
from autotune.study.trials import baseline_trial
from autotune.trial.probe import PROBE_FILE, ProbeMismatch, compare, read_probe
from autotune.trial.record import Outcome, Role, TrialRecord

_logger = get_logger(__name__)

QUALITY = Outcome.QUALITY.value


#: the reference probe as this host's trials read it (a copy of the study's, written per trial)
REFERENCE_FILE = "reference_probe.json"
#: ``retry_reason`` of a lossy config queued again to wait for the baseline's probe
AWAITING_BASELINE = "a lossy config waits for the baseline's probe to be judged by"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a trial's worker probes, and what its probe is judged against.

    Attributes:
        probe: The probe settings for the worker (None: it runs no probe).
        reference: The baseline trial whose probe is the reference.
        reference_path: That probe, as a file on this host.
        missing: Why there is no reference (None when there is one, or for the baseline).
        pending: The baseline has not finished yet: a lossy config should wait for it.
    """

    probe: dict[str, Any] | None
    reference: int | None = None
    reference_path: Path | None = None
    missing: str | None = None
    pending: bool = False


def publish(study: optuna.Study, baseline: int, probe_path: Path) -> bool:
    """Store the baseline's probe in the study (every host compares with it). Returns whether
    there was one to store."""
    try:
        probe = read_probe(probe_path)
    except (OSError, ValueError) as e:
        _logger.debug("no reference probe at %s: %s", probe_path, e)
        return False
    store_reference(study, baseline, probe)
    return True


def _stored(study: optuna.Study) -> StoredReference | None:
    """The study's reference; a study from before it was stored keeps it in the baseline's
    directory, which is read (and stored) here."""
    ref = stored_reference(study)
    if ref is not None:
        return ref
    base = baseline_trial(study)
    trial_dir = TrialRecord.of(base).trial_dir if base is not None else None
    if base is None or not trial_dir or not publish(study, base.number, Path(trial_dir) / PROBE_FILE):
        return None
    return stored_reference(study)


def _baseline_states(study: optuna.Study) -> set[optuna.trial.TrialState]:
    """The states of the baseline's trials that have not finished: RUNNING (here or in another
    worker) and WAITING (queued, or queued again after a cold timeout or a crash)."""
    unfinished = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    return {
        t.state
        for t in study.get_trials(deepcopy=False, states=unfinished)
        if TrialRecord.of(t).role is Role.BASELINE
    }


def plan(trial: optuna.Trial, study_dir: Path, wait_s: float, max_len: int | None = None) -> Plan:
    """The probe ``trial``'s worker runs, and the reference it is judged against.

    The baseline writes the reference, its prompts short enough for ``max_len`` (the least
    ``max_model_len`` a trial of the study may run with: each must score the sequences). Any
    other trial scores the reference's sequences, waiting up to ``wait_s`` for a baseline that
    another worker is running; a baseline that is queued, or still running after that, leaves
    the plan ``pending``.
    """
    if TrialRecord.of(trial).role is Role.BASELINE:
        return Plan({"max_len": max_len} if max_len else {})
    study = trial.study
    deadline = time.monotonic() + wait_s
    while True:
        ref = _stored(study)
        if ref is not None:
            path = study_dir / REFERENCE_FILE
            write_json_atomic(path, ref.probe)
            return Plan({"reference": str(path)}, ref.trial, path)
        base = baseline_trial(study)
        if base is not None:
            record = TrialRecord.of(base)
            cause = record.quality.get("probe_error") or f"see {record.log or 'its log'}"
            return Plan(None, missing=f"the baseline (trial #{base.number}) wrote no probe ({cause})")
        states = _baseline_states(study)
        if not states:  # it failed and will not run again (the run stops for that), or there is none
            return Plan(None, missing="the study's baseline did not complete")
        if optuna.trial.TrialState.RUNNING not in states or time.monotonic() >= deadline:
            return Plan(None, missing="the baseline has not finished yet", pending=True)
        time.sleep(2.0)


def judge(result: TrialRecord, plan: Plan, budget: float, lossy: list[str]) -> TrialRecord:
    """``result`` with its quality against ``plan``'s reference; PRUNED (``quality``) when over
    ``budget``, or when it is lossy and could not be compared."""
    if result.outcome is not Outcome.SUCCESS:
        return result
    probe = Path(result.trial_dir or ".") / PROBE_FILE
    why = None
    if plan.reference_path is None:
        why = f"no reference probe to compare it with: {plan.missing or 'the study has no baseline'}"
    elif not probe.is_file():
        cause = result.quality.get("probe_error") or f"see {result.log or 'its log'}"
        why = f"its probe wrote nothing ({cause})"
    else:
        try:
            quality = compare(read_probe(plan.reference_path), read_probe(probe), plan.reference)
        except (ProbeMismatch, OSError, ValueError, KeyError) as e:
            why = f"its probe does not compare with the baseline's ({e})"
        else:
            stated = {**result.quality, **quality.to_dict(), "budget": budget}
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
        (_logger.info if plan.pending else _logger.warning)("trial quality not measured: %s", why)
        return result
    return dataclasses.replace(
        result,
        outcome=Outcome.QUALITY,
        error_type=QUALITY,
        error=f"{', '.join(lossy)} changes the model's outputs, and {why}",
    )
