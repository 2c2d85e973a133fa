"""Progress of a run, for a person: one log line per finished trial and a live bar with the best
so far and an ETA. It only shows; when the run stops is :mod:`autotune.tuning.stopping`'s call."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import optuna

from autotune._logging import get_logger
from autotune.study.budget import counted_trials
from autotune.study.objectives import primary_value
from autotune.study.trials import baseline_trial, best_or_none
from autotune.trial.outcome import error_summary
from autotune.trial.record import Outcome, Role, TrialRecord

_logger = get_logger(__name__)

#: a generate phase shorter than this is a noisy objective: say so, once per run
SHORT_MEASUREMENT_S = 15.0


def _fmt_params(params: dict[str, Any], limit: int = 6) -> str:
    items = [f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()]
    more = f" +{len(items) - limit}" if len(items) > limit else ""
    return " ".join(items[:limit]) + more if items else "(vLLM defaults)"


def fmt_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


@dataclass
class Progress:
    """Optuna callback: logs each finished trial (trial n/N, value, best so far, ETA) and keeps a
    progress bar of the study's budget (trials counted in storage, over every worker)."""

    budget: int
    objective: str
    counted_at_start: int = 0
    show_bar: bool = True
    started: float = field(default_factory=time.time)
    #: generate phases shorter than this get one warning (None: no warning)
    short_measurement_s: float | None = SHORT_MEASUREMENT_S
    launched: int = 0
    _bar: Any = None
    _warned_short: bool = False
    _warned_shortened: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    parallel: int = 1
    #: a Pareto study's objectives after the first (their values are logged beside it)
    others: tuple[str, ...] = ()
    #: running trials of this process: number -> (phase, when it began)
    _running: dict[int, tuple[str, float]] = field(default_factory=dict)
    _walls: list[float] = field(default_factory=list)
    _best: str = "no completed trial yet"
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if not self.show_bar:
            return
        from tqdm import tqdm

        # no tqdm rate or ETA: a jump of one trial after minutes reads as a burst; ours is below
        self._bar = tqdm(
            total=self.budget,
            initial=self.counted_at_start,
            unit="trial",
            dynamic_ncols=True,
            leave=False,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} trials [{elapsed}]{postfix}",
        )
        # redrawn every second, so the elapsed time and the running trial's phase stay current
        threading.Thread(target=self._refresh_loop, name="autotune-progress", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def phase(self, number: int, name: str | None) -> None:
        """A running trial of this process entered phase ``name`` (from its worker's reports);
        None: its process is gone."""
        with self._lock:
            if name is None:
                self._running.pop(number, None)
            else:
                self._running[number] = (name, time.time())

    def _eta(self, left: int) -> float:
        """Seconds for ``left`` more trials: the median trial of this run, over the slots."""
        if self._walls:
            return statistics.median(self._walls) * left / max(1, self.parallel)
        return (time.time() - self.started) / max(1, self.launched) * left

    def _refresh_loop(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._redraw()

    def _redraw(self) -> None:
        if self._bar is None:
            return
        now = time.time()
        running = " ".join(
            f"#{n} {ph} {now - since:.0f}s" for n, (ph, since) in sorted(self._running.items())
        )
        eta = f" | ETA {fmt_duration(self._eta(max(0, self.budget - self._bar.n)))}" if self.launched else ""
        self._bar.set_postfix_str(" | ".join(filter(None, [self._best + eta, running])), refresh=False)
        self._bar.refresh()

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        with self._lock:  # parallel trials (one per GPU slot) end in their own threads
            self._after(study, trial)

    def _after(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self._running.pop(trial.number, None)
        record = TrialRecord.of(trial)
        if record.set_aside:
            (_logger.info if record.outcome is Outcome.DEFERRED else _logger.debug)(
                "trial #%d not run: %s", trial.number, record.error
            )
            return
        if record.duplicate_of is not None:
            _logger.info(
                "trial #%d: config measured already by #%d, not run again", trial.number, record.duplicate_of
            )
            return
        if record.skipped:
            _logger.debug("trial #%d skipped: %s", trial.number, record.error)
            return
        self.launched += 1
        if record.wall_s:
            self._walls.append(record.wall_s)
        counted = counted_trials(study)
        self._log(study, trial, record, counted)
        self._warn_if_short(trial.number, record)
        self._warn_if_shortened(trial.number, record)
        if self._bar is not None:  # counted, not launched: a trial run again is counted once
            self._bar.n = counted
            self._redraw()

    def _warn_if_shortened(self, number: int, record: TrialRecord) -> None:
        shortened = record.metrics.get("shortened_requests")
        if self._warned_shortened or not shortened:
            return
        self._warned_shortened = True
        _logger.warning(
            "trial #%d: %d of %d requests were shortened to fit max_model_len=%s: %s of %s requested "
            "output tokens are generated, in every trial; to measure the whole workload raise "
            "max_model_len (--set max_model_len=N) or use shorter prompts",
            number,
            shortened,
            record.metrics.get("num_requests", 0),
            record.engine.get("max_model_len", "?"),
            f"{record.metrics.get('output_tokens', 0):,}",
            f"{record.metrics.get('requested_output_tokens', 0):,}",
        )

    def _warn_if_short(self, number: int, record: TrialRecord) -> None:
        generate_s = record.metrics.get("generate_s")
        limit = self.short_measurement_s
        if self._warned_short or limit is None or generate_s is None or generate_s >= limit:
            return
        self._warned_short = True
        _logger.warning(
            "trial #%d measured its generate phase for only %.1f s: a measurement this short is "
            "easily disturbed, so small differences between trials may be chance; a larger "
            "workload (e.g. count=5000) gives a steadier objective",
            number,
            generate_s,
        )

    def _log(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, record: TrialRecord, counted: int
    ) -> None:
        base = baseline_trial(study)
        base_value = primary_value(base) if base is not None else None
        value = primary_value(trial)
        if trial.state == optuna.trial.TrialState.COMPLETE and value is not None:
            elsewhere = base is not None and record.elsewhere_than(TrialRecord.of(base))
            against = "the defaults' run on another device" if elsewhere else "defaults"
            speed = f" (x{value / base_value:.2f} vs {against})" if base_value else ""
            what = f"{value:,.1f} {self.objective}{speed}"
            if len(trial.values or ()) > 1:
                what += "".join(
                    f", {v:,.1f} {n}" for n, v in zip(self.others, trial.values[1:], strict=False)
                )
            if missed := [n for n, v in trial.constraints.items() if v > 0]:
                what += f" [misses SLO: {', '.join(missed)}]"
        else:
            what = f"{trial.state.name} [{record.error_type}] " + error_summary(record.error or "")[:160]
        best = best_or_none(study)
        best_txt = (
            f"best {primary_value(best) or 0.0:,.1f} (#{best.number})"
            if best is not None
            else "no completed trial yet"
        )
        eta = self._eta(max(0, self.budget - counted))
        # what the trial set: a queued one's params also hold what vLLM resolved for the rest
        params = trial.params if record.role is Role.SAMPLED else (record.config or {})
        _logger.info(
            "trial %d/%d [#%d%s] %s | %s | %s | %s | ETA %s",
            counted,
            self.budget,
            trial.number,
            "" if record.role is Role.SAMPLED else f" {record.role.value}",
            what,
            best_txt,
            _fmt_params(params or {}),
            f"{record.wall_s:.0f} s" if record.wall_s else "-",
            fmt_duration(eta),
        )
        self._best = best_txt
