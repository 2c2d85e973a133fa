"""What the study's TPE proposes next after its first N trials: with the queued trials (baseline,
informed start) recorded as they were (only the keys their config sets), and with the values vLLM
resolved for the rest recorded too (``autotune.tuning.resolved``). No GPU: the sampler only.

    PYTHONPATH=. python benchmarks/results/h100-2026-12-07-validated/tpe_replay.py \
        benchmarks/results/h100-2026-12-07-validated/s7b.db s7b 10 40

Each of the DRAWS proposals comes from the product's sampler (``make_sampler``) with its own seed,
on a copy of the study's first N trials.
"""

from __future__ import annotations

import statistics
import sys
import warnings

import optuna
from optuna.trial import TrialState, create_trial

from autotune.space.spec import ParamSpec
from autotune.study.lifecycle import make_sampler
from autotune.study.settings import raw_settings
from autotune.trial.record import Role, TrialRecord
from autotune.tuning.resolved import resolved_params


def specs(study: optuna.Study) -> list[ParamSpec]:
    out = []
    for name, p in raw_settings(study)["space"]["parameters"].items():
        out.append(
            ParamSpec(
                name=name,
                type=p["type"],
                low=p.get("low"),
                high=p.get("high"),
                log=bool(p.get("log")),
                step=p.get("step"),
                choices=tuple(p.get("choices") or ()),
            )
        )
    return out


def copy(
    trials: list[optuna.trial.FrozenTrial],
    parameters: list[ParamSpec],
    fixed: dict[str, object],
    resolved: bool,
) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for t in trials:
        params, dists = dict(t.params), dict(t.distributions)
        record = TrialRecord.of(t)
        if resolved and record.role is not Role.SAMPLED:
            for name, value in resolved_params(parameters, record, params, fixed).items():
                params[name] = value
                dists[name] = next(p for p in parameters if p.name == name).distribution()
        study.add_trial(
            create_trial(
                params=params,
                distributions=dists,
                value=t.values[0] if t.state is TrialState.COMPLETE else None,
                state=t.state,
                intermediate_values=dict(t.intermediate_values),
            )
        )
    return study


def main() -> None:
    db, name, upto, draws = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    source = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    parameters = specs(source)
    fixed = raw_settings(source)["space"].get("fixed") or {}
    dists = {p.name: p.distribution() for p in parameters}
    trials = [
        t
        for t in source.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        if t.number < upto
    ]
    best = max((t for t in trials if t.state is TrialState.COMPLETE), key=lambda t: t.values[0])
    print(f"{db} ({name}): {len(trials)} of its first {upto} trials finished; best #{best.number}")
    print("| queued trials recorded | eager | fp8 weights | fp8 KV | async | max_num_seqs (median) |")
    print("|---|---|---|---|---|---|")
    for resolved in (False, True):
        picks = []
        for seed in range(draws):
            study = copy(trials, parameters, fixed, resolved)
            study.sampler = make_sampler(seed, len(trials))
            picks.append(study.ask(dists).params)

        def share(key: str, value: object, picks: list[dict[str, object]] = picks) -> str:
            return f"{sum(p[key] == value for p in picks)}/{len(picks)}"

        seqs = statistics.median(int(p["max_num_seqs"]) for p in picks)  # type: ignore[call-overload]
        print(
            f"| {'with the resolved values' if resolved else 'as their config set them'} "
            f"| {share('enforce_eager', True)} | {share('quantization', 'fp8')} "
            f"| {share('kv_cache_dtype', 'fp8')} | {share('async_scheduling', True)} | {seqs:.0f} |"
        )


if __name__ == "__main__":
    main()
