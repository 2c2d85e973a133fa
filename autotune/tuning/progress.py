"""Progress of a run: one log line per finished trial and a live bar with best-so-far and ETA."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import optuna

from autotune._logging import get_logger
from autotune.study.lifecycle import DUPLICATE_ATTR, ROLE_ATTR, baseline_trial, best_trial, counted_trials
from autotune.trial.outcome import engine_start_s

_logger = get_logger(__name__)

#: a warm engine start's share of a cold one (torch.compile and CUDA-graph caches empty): on the
#: H200 0.18-0.28 for Llama-3.2-1B (27-41 s vs 146 s), 0.26-0.34 for Llama-2-7B (36-47 s vs 139 s)
WARM_START_FRACTION = 0.35

#: a generate phase shorter than this is a noisy objective: say so, once per run
SHORT_MEASUREMENT_S = 15.0


def _fmt_params(params: dict[str, Any], limit: int = 6) -> str:
    items = [f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()]
    more = f" +{len(items) - limit}" if len(items) > limit else ""
    return " ".join(items[:limit]) + more if items else "(vLLM defaults)"


@dataclass
class Progress:
    """Optuna callback: logs each trial, stops the study once its ``budget`` is used up.

    The budget is the study's (all workers together): trials counted in storage by
    :func:`autotune.study.lifecycle.counted_trials`. Configs skipped by a constraint (no engine started)
    and interrupted trials don't use it up; after
    ``max_consecutive_skips`` of them in a row the run stops, since the constraints then rule
    out nearly everything the sampler proposes.
    """

    budget: int
    objective: str
    counted_at_start: int = 0
    show_bar: bool = True
    time_budget_s: float | None = None
    #: wall times of the study's trials from earlier runs: a fresh machine's cold first trial is
    #: then not taken as what every trial costs
    earlier_walls: list[float] = field(default_factory=list)
    parallel: int = 1
    max_consecutive_skips: int = 50
    max_consecutive_repeats: int = 20
    consecutive_repeats: int = 0
    stopped_for_repeats: bool = False
    launched: int = 0
    consecutive_skips: int = 0
    started: float = field(default_factory=time.time)
    stopped_for_skips: bool = False
    stopped_for_time: bool = False
    #: generate phases shorter than this get one warning (None: no warning)
    short_measurement_s: float | None = SHORT_MEASUREMENT_S
    _bar: Any = None
    _warned_short: bool = False
    _trial_walls: list[float] = field(default_factory=list)
    _last_end: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._last_end = self.started
        if self.show_bar:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.budget,
                initial=self.counted_at_start,
                unit="trial",
                dynamic_ncols=True,
                leave=False,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        with self._lock:  # parallel trials (one per GPU slot) end in their own threads
            self._after(study, trial)

    def _after(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.user_attrs.get("error_type") == "over_budget":
            _logger.debug("trial #%d not run: %s", trial.number, trial.user_attrs.get("error"))
            return
        if DUPLICATE_ATTR in trial.user_attrs:
            self.consecutive_repeats += 1
            _logger.info(
                "trial #%d: config measured already by #%d, not run again",
                trial.number,
                trial.user_attrs[DUPLICATE_ATTR],
            )
            if self.consecutive_repeats >= self.max_consecutive_repeats:
                self.stopped_for_repeats = True
                _logger.info(
                    "the sampler proposed only configs measured already, %d times in a row: the "
                    "search has converged on this space; export the best, or widen the space",
                    self.consecutive_repeats,
                )
                study.stop()
            return
        self.consecutive_repeats = 0
        skipped = trial.user_attrs.get("error_type") == "constraint"
        if skipped:
            self.consecutive_skips += 1
            _logger.debug("trial #%d skipped: %s", trial.number, trial.user_attrs.get("error"))
            if self.consecutive_skips >= self.max_consecutive_skips:
                self.stopped_for_skips = True
                study.stop()
            return
        self.consecutive_skips = 0
        self.launched += 1
        counted = counted_trials(study)
        self._log(study, trial, counted)
        self._warn_if_short(trial)
        if self._bar is not None:  # counted, not launched: a trial run again is counted once
            self._bar.n = counted
            self._bar.refresh()
        if counted >= self.budget:
            study.stop()
        elif self.time_budget_s is not None:
            # start another trial only if one of median length still fits in the time left (the
            # median, not the mean: a machine's first trial pays for cold compile caches)
            now = time.time()
            # one trial's length: the gap since the last trial ended (sampling and bookkeeping
            # included) with one slot; with parallel slots gaps are shorter, so its own wall
            wall = now - self._last_end
            if self.parallel > 1:
                wall = float(trial.user_attrs.get("wall_s") or wall * self.parallel)
            if not self.earlier_walls and len(self._trial_walls) < self.parallel:
                # a fresh study's first trials start cold: count their engine start as a warm one
                phases = trial.user_attrs.get("phases_s") or {}
                cold_s = engine_start_s(phases, trial.user_attrs.get("wall_s"))
                wall = max(0.0, wall - cold_s * (1 - WARM_START_FRACTION))
            self._trial_walls.append(wall)
            self._last_end = now
            length = statistics.median([*self.earlier_walls, *self._trial_walls])
            if now - self.started + length > self.time_budget_s:
                self.stopped_for_time = True
                _logger.info(
                    "time budget of %.0f s: stopping after %d trial(s); the same command resumes",
                    self.time_budget_s,
                    self.launched,
                )
                study.stop()

    def _warn_if_short(self, trial: optuna.trial.FrozenTrial) -> None:
        generate_s = (trial.user_attrs.get("metrics") or {}).get("generate_s")
        limit = self.short_measurement_s
        if self._warned_short or limit is None or generate_s is None or generate_s >= limit:
            return
        self._warned_short = True
        _logger.warning(
            "trial #%d measured its generate phase for only %.1f s: a measurement this short is "
            "easily disturbed, so small differences between trials may be chance; a larger "
            "workload (e.g. count=5000) gives a steadier objective",
            trial.number,
            generate_s,
        )

    def _log(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, counted: int) -> None:
        base = baseline_trial(study)
        base_value = base.value if base is not None else None
        if trial.state == optuna.trial.TrialState.COMPLETE and trial.value is not None:
            speed = f" (x{trial.value / base_value:.2f} vs defaults)" if base_value else ""
            what = f"{trial.value:,.1f} {self.objective}{speed}"
        else:
            what = (
                f"{trial.state.name} [{trial.user_attrs.get('error_type')}] "
                + str(trial.user_attrs.get("error") or "")[:160]
            )
        try:
            best = best_trial(study)
            best_txt = f"best {best.value:,.1f} (#{best.number})"
        except ValueError:
            best_txt = "no completed trial yet"
        elapsed = time.time() - self.started
        eta = elapsed / self.launched * max(0, self.budget - counted)
        role = trial.user_attrs.get(ROLE_ATTR, "sampled")
        params = trial.params if role != "enqueued" else trial.user_attrs.get("autotune_config", {})
        wall = trial.user_attrs.get("wall_s")
        _logger.info(
            "trial %d/%d [#%d%s] %s | %s | %s | %s | ETA %s",
            counted,
            self.budget,
            trial.number,
            "" if role == "sampled" else f" {role}",
            what,
            best_txt,
            _fmt_params(params),
            f"{wall:.0f} s" if wall else "-",
            _fmt_duration(eta),
        )
        if self._bar is not None:
            self._bar.set_postfix_str(best_txt)


def _fmt_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
