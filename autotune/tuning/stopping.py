"""When a run stops: an Optuna callback holding the run's stopping rules, apart from the display.

The rules, checked after every trial (as Syne Tune's stopping criteria and Optuna's
``MaxTrialsCallback`` are):

- **budget**: the study's trials, counted in the storage over every worker, reach its budget;
- **time**: the next trial would likely end after ``--time-budget`` (a trial's length is the
  median of the study's trials so far; a fresh machine's cold first engine start is counted at a
  warm start's share);
- **skips**: the constraints ruled out ``max_consecutive_skips`` proposals in a row (they rule
  out nearly the whole space);
- **repeats**: the sampler proposed configs measured already ``max_consecutive_repeats`` times in
  a row (the search has converged);
- **baseline**: the baseline (vLLM's defaults under the fixed args) failed and will not run again:
  no speedup can be measured, and what failed it (an out-of-memory default, a wrong fixed arg)
  usually fails every other config too.
"""

from __future__ import annotations

import enum
import statistics
import threading
import time
from dataclasses import dataclass, field

import optuna

from autotune._logging import get_logger
from autotune.study.budget import counted_trials
from autotune.study.trials import failed_baseline
from autotune.trial.outcome import engine_start_s
from autotune.trial.record import Role, TrialRecord

_logger = get_logger(__name__)

#: a warm engine start's share of a cold one (torch.compile and CUDA-graph caches empty): on the
#: H200 0.18-0.28 for Llama-3.2-1B (27-41 s vs 146 s), 0.26-0.34 for Llama-2-7B (36-47 s vs 139 s)
WARM_START_FRACTION = 0.35


class StopReason(enum.Enum):
    BUDGET = "budget"
    TIME = "time"
    SKIPS = "skips"
    REPEATS = "repeats"
    BASELINE = "baseline"


@dataclass
class StopRules:
    """Optuna callback: calls ``study.stop()`` once a rule fires and remembers which one."""

    budget: int
    time_budget_s: float | None = None
    #: wall times of the study's trials from earlier runs: a fresh machine's cold first trial is
    #: then not taken as what every trial costs
    earlier_walls: list[float] = field(default_factory=list)
    parallel: int = 1
    max_consecutive_skips: int = 50
    max_consecutive_repeats: int = 20
    started: float = field(default_factory=time.time)
    reason: StopReason | None = None
    launched: int = 0
    consecutive_skips: int = 0
    consecutive_repeats: int = 0
    _trial_walls: list[float] = field(default_factory=list)
    _last_end: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def stopped_for_time(self) -> bool:
        return self.reason is StopReason.TIME

    @property
    def stopped_for_skips(self) -> bool:
        return self.reason is StopReason.SKIPS

    @property
    def stopped_for_repeats(self) -> bool:
        return self.reason is StopReason.REPEATS

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        with self._lock:  # parallel trials (one per GPU slot) end in their own threads
            reason = self._check(study, trial)
            if reason is None:
                return
            # the first reason that is not the budget's is the one the run reports
            if self.reason in (None, StopReason.BUDGET):
                self.reason = reason
        study.stop()

    def _check(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> StopReason | None:
        record = TrialRecord.of(trial)
        if record.set_aside:
            # a worker that did not run the baseline learns here that it failed for good
            return StopReason.BASELINE if failed_baseline(study) is not None else None
        if record.duplicate_of is not None:
            self.consecutive_repeats += 1
            if self.consecutive_repeats < self.max_consecutive_repeats:
                return None
            _logger.info(
                "the sampler proposed only configs measured already, %d times in a row: the "
                "search has converged on this space; export the best, or widen the space",
                self.consecutive_repeats,
            )
            return StopReason.REPEATS
        self.consecutive_repeats = 0
        if record.skipped:
            if failed_baseline(study) is not None:
                return StopReason.BASELINE
            self.consecutive_skips += 1
            return StopReason.SKIPS if self.consecutive_skips >= self.max_consecutive_skips else None
        self.consecutive_skips = 0
        self.launched += 1
        if record.role is Role.BASELINE and failed_baseline(study) is not None:
            return StopReason.BASELINE
        if counted_trials(study) >= self.budget:
            return StopReason.BUDGET
        if self.time_budget_s is None:
            return None
        # start another trial only if one of median length still fits in the time left (the
        # median, not the mean: a machine's first trial pays for cold compile caches)
        now = time.time()
        # one trial's length: the gap since the last trial ended (sampling and bookkeeping
        # included) with one slot; with parallel slots gaps are shorter, so its own wall
        wall = now - (self._last_end if self._last_end is not None else self.started)
        if self.parallel > 1:
            wall = float(record.wall_s or wall * self.parallel)
        if not self.earlier_walls and len(self._trial_walls) < self.parallel:
            # a fresh study's first trials start cold: count their engine start as a warm one
            cold_s = engine_start_s(record.phases_s, record.wall_s)
            wall = max(0.0, wall - cold_s * (1 - WARM_START_FRACTION))
        self._trial_walls.append(wall)
        self._last_end = now
        length = statistics.median([*self.earlier_walls, *self._trial_walls])
        if now - self.started + length <= self.time_budget_s:
            return None
        _logger.info(
            "time budget of %.0f s: stopping after %d trial(s); the same command resumes",
            self.time_budget_s,
            self.launched,
        )
        return StopReason.TIME
