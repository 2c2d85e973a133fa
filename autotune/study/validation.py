"""Validation rounds in the study's storage: a second Optuna study beside the search's.

The validation study of study ``S`` is ``S:validation`` (a name ``--study`` cannot take, so it
never clashes with a user's study). Each of its trials measures one config again in one round:
the baseline's or a search trial's (``validates``), in round ``validation_round``. Being another
study, its measurements never reach the search's sampler nor use its budget; being in the same
storage, they survive ``kill -9``, resume, and are shared by PostgreSQL workers through Optuna's
queue (a queued trial is taken by exactly one worker).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from autotune.study.lifecycle import load_existing
from autotune.study.objectives import primary_value
from autotune.trial.record import Outcome, Role, TrialRecord

SUFFIX = ":validation"
#: the validation study's user attribute naming the study it validates
PARENT_ATTR = "autotune_validates_study"

_FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


def validation_name(study_name: str) -> str:
    return study_name + SUFFIX


def is_validation_study(name: str) -> bool:
    return name.endswith(SUFFIX)


def open_validation(study: optuna.Study, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """The validation study of ``study``, created on first use."""
    name = validation_name(study.study_name)
    val = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)
    if PARENT_ATTR not in val.user_attrs:
        val.set_user_attr(PARENT_ATTR, study.study_name)
    return val


def load_validation(study: optuna.Study) -> optuna.Study | None:
    """The validation study of ``study`` if it has one (read-only use)."""
    return load_existing(validation_name(study.study_name), study._storage)


def top_configs(study: optuna.Study, k: int) -> list[optuna.trial.FrozenTrial]:
    """The ``k`` best completed search trials with distinct engine args, the baseline's left out
    (it is measured in every round anyway), repeats counted once, and none that missed a
    constraint (serve mode's SLOs)."""
    baseline_kwargs = [
        TrialRecord.of(t).engine_kwargs
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if TrialRecord.of(t).role is Role.BASELINE
    ]
    seen = [kw for kw in baseline_kwargs if kw is not None]
    out = []
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    for t in sorted((t for t in done if t.values), key=lambda t: -float(primary_value(t) or 0.0)):
        record = TrialRecord.of(t)
        if record.duplicate_of is not None or record.engine_kwargs is None or record.engine_kwargs in seen:
            continue
        if any(v > 0 for v in t.constraints.values()):
            continue
        seen.append(record.engine_kwargs)
        out.append(t)
        if len(out) == k:
            break
    return out


@dataclass(frozen=True)
class Measurement:
    """One validation trial, as the verdict reads it."""

    number: int
    validates: int
    round: int
    value: float | None
    finished: bool


def measurements(val: optuna.Study) -> list[Measurement]:
    """Every validation trial that is queued, running or finished for good (a trial cut off and
    queued again is left out: its retry stands for it); one per slot, the first finished."""
    trials = val.get_trials(deepcopy=False)
    retried = {TrialRecord.of(t).retry_of for t in trials}
    by_slot: dict[tuple[int, int], Measurement] = {}
    for t in trials:
        record = TrialRecord.of(t)
        if record.validates is None or record.validation_round is None or t.number in retried:
            continue
        if record.outcome in (Outcome.INTERRUPTED, Outcome.OVER_BUDGET):
            continue
        m = Measurement(
            number=t.number,
            validates=record.validates,
            round=record.validation_round,
            value=t.value if t.state == optuna.trial.TrialState.COMPLETE else None,
            finished=t.state in _FINISHED,
        )
        key = (m.round, m.validates)
        if key not in by_slot or (m.finished and not by_slot[key].finished):
            by_slot[key] = m
    return sorted(by_slot.values(), key=lambda m: (m.round, m.number))


def plan_rounds(
    existing: Sequence[Measurement], members: Sequence[int], rounds: int, seed: int
) -> list[tuple[int, int]]:
    """The ``(round, validates)`` slots to queue so that each of ``members`` (the baseline's
    search trial first, then the candidates') is measured in ``rounds`` rounds beside the baseline.

    A round's slots are queued at once, and a killed validation runs the ones still queued. A
    config that joins the top later (a resumed search found it, ``--top`` grew) never joins a
    round planned without it, which another machine or day may have measured: its speedup in that
    round would set it beside a baseline it was never measured with. It is measured in new
    rounds, each with the baseline again; so is a config whose round lost its baseline's slot (a
    kill while the round was being queued). The new rounds come after every earlier one, each in
    its own seeded shuffled order, so drift hits every config in it alike.
    """
    baseline, *candidates = members
    paired = {m.round for m in existing if m.validates == baseline}
    deficit = {
        v: rounds - sum(1 for m in existing if m.validates == v and m.round in paired) for v in candidates
    }
    start = max((m.round for m in existing), default=-1) + 1
    slots: list[tuple[int, int]] = []
    for i in range(max(deficit.values(), default=0)):
        r = start + i
        order = [baseline] + [v for v in candidates if deficit[v] > i]
        random.Random(seed * 1_000_003 + r).shuffle(order)
        slots += [(r, v) for v in order]
    return slots


def queue_rounds(val: optuna.Study, slots: Sequence[tuple[int, int]], roles: dict[int, Role]) -> None:
    for r, v in slots:
        record = TrialRecord(role=roles.get(v, Role.SAMPLED), validates=v, validation_round=r)
        val.enqueue_trial({}, user_attrs=record.attrs(), skip_if_exists=False)


def rounds_of(existing: Sequence[Measurement], validates: int, n_rounds: Sequence[int]) -> list[float | None]:
    """One config's value in each of ``n_rounds`` (None where it has none or it failed)."""
    by_round = {m.round: m.value for m in existing if m.validates == validates}
    return [by_round.get(r) for r in n_rounds]
