"""Tell the sampler what a queued trial ran with where its config left a searched parameter to vLLM.

The baseline, a ``--enqueue`` config and the informed start are measured exactly as written: a
searched parameter they leave unset runs at vLLM's default. Recorded with only the keys they set,
TPE saw them as points of other, smaller search spaces (its group decomposition splits the space
along their key sets) and never learned that e.g. the informed configs ran with CUDA graphs or
with bf16 weights. On the committed H100 study of 2026-12-07 (10 trials), TPE's next proposals
held fp8 weights 0 times in 40 while the study's best ran with them, 40 times in 40 once the
queued trials' resolved values were recorded (``benchmarks/results/h100-2026-12-07-validated``).

Once such a trial's engine has started, its resolved config (the record's ``engine``) says what
each unset parameter was, and that value is recorded as the trial's param, a number outside its
range included (as Optuna records an enqueued one). A value off a categorical's choices (e.g.
CUDA graphs up to 468 where the space offers 256, 512 and 1,024) stays unrecorded; a categorical
whose choices hold None (vLLM decides) records None where vLLM's config does not name it. A
config that sets what the sampler cannot see (an engine arg neither searched nor fixed, a value
outside a categorical's choices) records nothing more: its speed is not the searched values' doing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna

from autotune._logging import get_logger
from autotune.analysis.records import ENGINE_ALIASES
from autotune.space.spec import ParamSpec, SearchSpace
from autotune.trial.record import Role, TrialRecord

_logger = get_logger(__name__)


def resolved_params(
    parameters: Sequence[ParamSpec], record: TrialRecord, known: dict[str, Any], fixed: dict[str, Any]
) -> dict[str, Any]:
    """Values for the searched parameters missing from ``known`` (the trial's params) that
    ``record``'s config left to vLLM, as vLLM resolved them; none before the engine started, and
    none where the config set an engine arg that is neither a recorded param nor in ``fixed``."""
    if not record.engine:
        return {}
    kwargs = record.engine_kwargs or {}
    unseen = object()
    if any(k != "model" and k not in known and fixed.get(k, unseen) != v for k, v in kwargs.items()):
        return {}  # it set an arg the sampler cannot see, a value off the choices, a fixed one anew
    out: dict[str, Any] = {}
    for p in parameters:
        if p.name in known:  # set by the config (anything else it sets returned above)
            continue
        alias = ENGINE_ALIASES.get(p.name, p.name)
        if alias in record.engine:
            value = record.engine[alias]
        elif p.type == "categorical" and None in p.choices:
            value = None  # vLLM picks (e.g. the attention backend): the space's "unset" choice
        else:
            continue
        if value is not None and p.type == "int" and isinstance(value, float) and value.is_integer():
            value = int(value)
        if p.records(value):
            out[p.name] = value
    return out


def record_resolved(trial: optuna.Trial, space: SearchSpace, result: TrialRecord) -> dict[str, Any]:
    """Record :func:`resolved_params` as ``trial``'s params (a queued trial only: a sampled one has
    them all). Returns what was recorded; a failure to record costs the sampler those values, never
    the trial its measurement."""
    if TrialRecord.of(trial).role is Role.SAMPLED:
        return {}
    recorded: dict[str, Any] = {}
    by_name = {p.name: p for p in space.parameters}
    try:
        for name, value in resolved_params(space.parameters, result, trial.params, space.fixed).items():
            dist = by_name[name].distribution()
            # Optuna records a param only through suggest_*, which would sample one not fixed when
            # the trial was queued; the storage's own API records the value it ran with instead
            trial.storage.set_trial_param(trial._trial_id, name, dist.to_internal_repr(value), dist)
            recorded[name] = value
    except Exception as e:  # a storage error, a trial another worker has finished, ...
        _logger.warning(
            "trial #%d: the values vLLM resolved for its unset parameters were not all recorded for "
            "the sampler (%s: %s); its measurement stands",
            trial.number,
            type(e).__name__,
            e,
        )
    return recorded
