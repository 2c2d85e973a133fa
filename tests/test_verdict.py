"""The statistics of validation rounds (issue 16) on synthetic rounds whose truth is known."""

from __future__ import annotations

import pytest

from autotune.analysis.verdict import judge


def test_a_clear_winner_is_named_with_its_interval():
    base = [1000.0, 1040.0, 980.0, 1010.0]
    v = judge(base, {5: [1200.0, 1250.0, 1170.0, 1215.0], 7: [1010.0, 1030.0, 990.0, 1000.0]})
    assert v.winner == 5 and v.overlapping == ()
    best = v.winning
    assert best is not None and best.ci95 is not None
    assert best.median == pytest.approx(1.2, abs=0.01) and best.ci95[0] > 1.0
    assert "trial #5 is faster than vLLM's defaults: x1.2" in v.verdict
    assert v.noise_cv is not None and 0.01 < v.noise_cv < 0.05
    assert v.to_dict()["speedup_ci95"] == list(best.ci95)


def test_candidates_within_the_noise_are_no_clear_winner():
    base = [1000.0, 1100.0, 950.0]
    v = judge(base, {3: [1190.0, 1180.0, 1150.0], 4: [1170.0, 1200.0, 1140.0]})
    assert v.winner in (3, 4) and v.overlapping  # both faster, their intervals overlap
    assert "no clear winner among the faster ones" in v.verdict


def test_an_interval_that_crosses_one_never_claims_a_speedup():
    base = [1000.0, 1000.0, 1000.0]
    v = judge(base, {2: [1300.0, 950.0, 1100.0]})  # median x1.1, but one round was slower
    (c,) = v.candidates
    assert c.ci95 is not None and c.ci95[0] < 1.0 < c.ci95[1] and not c.faster
    assert v.winner is None and v.verdict.startswith("keep vLLM's defaults")
    assert v.to_dict()["keep_defaults"] and v.to_dict()["speedup"] == 1.0


def test_one_round_or_a_failed_round_is_no_evidence():
    v = judge([1000.0], {1: [2000.0]})
    assert v.winner is None and v.candidates[0].ci95 is None and "not enough rounds" in v.verdict
    # a round whose baseline failed pairs nothing: the candidate has one ratio left
    v = judge([1000.0, None], {1: [1500.0, 1600.0]})
    assert v.candidates[0].ratios == (1.5,) and v.winner is None


def test_a_config_that_misses_an_slo_in_its_rounds_never_wins():
    base = [1000.0, 1040.0, 980.0, 1010.0]
    fast_but_late = [1500.0, 1550.0, 1480.0, 1520.0]
    fast = [1200.0, 1250.0, 1170.0, 1215.0]
    v = judge(base, {5: fast, 7: fast_but_late}, slo_misses={7: {"ttft_p99_ms": 812.0}, 5: {}})
    assert v.winner == 5 and v.candidates[0].trial == 7 and v.candidates[0].faster
    assert "faster but missing an SLO in these rounds: #7 (ttft_p99_ms)" in v.verdict
    alone = judge(base, {7: fast_but_late}, slo_misses={7: {"ttft_p99_ms": 812.0}})
    assert alone.winner is None and alone.verdict.startswith("keep vLLM's defaults")
    assert "#7 (ttft_p99_ms)" in alone.verdict


def test_defaults_that_miss_an_slo_in_their_rounds_are_no_verdict_to_keep():
    base = [1000.0, 1040.0, 980.0]
    v = judge(
        base,
        {3: [990.0, 1030.0, 985.0]},
        slo_misses={3: {}},
        baseline_slo_misses={"ttft_p99_ms": 700.0, "tpot_p99_ms": float("nan")},
    )
    assert v.winner is None and not v.to_dict()["keep_defaults"]
    assert v.verdict.startswith("no config that meets the SLOs was faster than vLLM's defaults")
    assert "vLLM's defaults miss an SLO in these rounds (ttft_p99_ms 700.0 ms, tpot_p99_ms not measured)" in (
        v.verdict
    )
    assert v.baseline_slo_misses == {
        "ttft_p99_ms": 700.0,
        "tpot_p99_ms": v.baseline_slo_misses["tpot_p99_ms"],
    }
    plain = judge(base, {3: [990.0, 1030.0, 985.0]}, slo_misses={3: {}})
    assert plain.verdict.startswith("keep vLLM's defaults: no config that meets the SLOs was faster")
    assert plain.to_dict()["keep_defaults"]


def test_a_search_run_the_rounds_contradict_is_named_with_its_compile_cache(tmp_path) -> None:
    """The H200 study of 2026-12-06: #10 ran x1.202 on a fresh compile, x1.120 on the loaded one."""
    import shutil
    from pathlib import Path

    import optuna

    from autotune.analysis.verdict import search_gaps, study_verdict

    db = tmp_path / "s7b.db"
    shutil.copy(Path(__file__).parents[1] / "benchmarks/results/h200-2026-12-06-study/s7b.db", db)
    v = study_verdict(optuna.load_study(study_name="s7b", storage=f"sqlite:///{db}"))
    assert v is not None and v.winner == 3 and v.baseline_search_value == pytest.approx(8488.9, abs=0.1)
    ten = next(c for c in v.candidates if c.trial == 10)
    assert ten.search_ratio == pytest.approx(1.202, abs=0.001) and ten.median == pytest.approx(
        1.120, abs=0.001
    )
    assert (ten.search_compile_cache, ten.round_compile_caches) == ("miss", ("hit", "hit"))
    (gap,) = search_gaps(v.to_dict())  # #3 agreed with its rounds (x1.339 vs x1.345)
    assert gap.startswith("#10: x1.202 in its search run, x1.120 validated (-6.8%)") and "miss" in gap


def test_a_gap_names_a_search_run_measured_on_another_device(tmp_path) -> None:
    """The H200 study of 2026-12-06 as if #10's search run had been on another GPU than the
    search's baseline, and the rounds on a third."""
    import json
    import shutil
    import sqlite3
    from pathlib import Path

    import optuna

    from autotune.analysis.verdict import search_gaps, study_verdict
    from autotune.study.validation import load_validation

    db = tmp_path / "s7b.db"
    shutil.copy(Path(__file__).parents[1] / "benchmarks/results/h200-2026-12-06-study/s7b.db", db)
    url = f"sqlite:///{db}"
    study = optuna.load_study(study_name="s7b", storage=url)
    val = load_validation(study)
    assert val is not None
    gpu = {t._trial_id: "GPU-c" for t in val.get_trials(deepcopy=False)}
    gpu |= {t._trial_id: "GPU-b" if t.number == 10 else "GPU-a" for t in study.get_trials(deepcopy=False)}
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM trial_user_attributes WHERE key = 'machine'")
        con.executemany(
            "INSERT INTO trial_user_attributes (trial_id, key, value_json) VALUES (?, ?, ?)",
            [(i, "machine", json.dumps({"host": "h", "gpu_uuids": [g]})) for i, g in gpu.items()],
        )
    v = study_verdict(optuna.load_study(study_name="s7b", storage=url))
    assert v is not None and v.baseline_elsewhere and v.mixed_rounds == ()
    assert {c.trial: c.search_other_device for c in v.candidates} == {3: False, 10: True}
    (gap,) = search_gaps(v.to_dict())
    assert gap.startswith("#10: x1.202 in its search run") and "miss" in gap
    assert "its search run was measured on another GPU or machine than vLLM's defaults" in gap


def test_a_baseline_that_moved_is_said_once_not_blamed_on_every_config() -> None:
    from dataclasses import replace

    from autotune.analysis.verdict import search_gaps

    v = judge([8212.4, 8290.3, 8252.6], {18: [10025.6, 10025.6, 10017.8]})
    # the search measured the defaults at 8,748 and #18 at 10,024.7 (x1.146): the defaults moved
    v = replace(v, baseline_search_value=8748.0, candidates=(replace(v.candidates[0], search_ratio=1.146),))
    (gap,) = search_gaps(v.to_dict())
    assert gap.startswith("vLLM's defaults: 8,748.0 in the search's baseline run, 8,252.6 here")
    assert "another GPU" not in gap
    (gap,) = search_gaps(replace(v, baseline_elsewhere=True).to_dict())
    assert gap.endswith("(the rounds ran on another GPU or machine than the search's baseline run)")
    assert search_gaps(judge([1000.0, 1010.0], {1: [1200.0, 1212.0]}).to_dict()) == []  # no search figures


def test_a_gap_split_between_the_defaults_and_the_config_is_still_said() -> None:
    from dataclasses import replace

    from autotune.analysis.verdict import search_gaps

    # defaults +1.5 %, the config -1.5 %: each within 2 %, their ratio off by 3 %
    v = judge([1015.0, 1015.0], {4: [1182.0, 1182.0]})
    v = replace(
        v,
        baseline_search_value=1000.0,
        candidates=(
            replace(
                v.candidates[0],
                search_ratio=1.2,
                search_compile_cache="miss",
                round_compile_caches=(None, None),
            ),
        ),
    )
    (gap,) = search_gaps(v.to_dict())
    assert gap.startswith("#4: x1.200 in its search run") and "compile cache" not in gap  # rounds' unknown


def _measured(slots):
    from autotune.study.validation import Measurement

    return [
        Measurement(number=n, validates=v, round=r, value=1.0, finished=True)
        for n, (r, v) in enumerate(slots)
    ]


def test_a_config_that_joins_the_top_later_gets_new_rounds_beside_a_new_baseline():
    from autotune.study.validation import plan_rounds

    # 3 rounds of the baseline (#0) and #13, measured yesterday; today's search found #26
    old = _measured([(r, v) for r in range(3) for v in (0, 13)])
    slots = plan_rounds(old, [0, 13, 26], rounds=3, seed=0)
    assert sorted(slots) == [(r, v) for r in (3, 4, 5) for v in (0, 26)]  # never into rounds 0-2
    # one more round asked for: every config in it, each round measured together
    both = plan_rounds(_measured([*((r, v) for r in range(3) for v in (0, 13)), *slots]), [0, 13, 26], 4, 0)
    assert sorted(both) == [(6, 0), (6, 13), (6, 26)]
    assert plan_rounds(old, [0, 13], 3, 0) == []  # nothing left to measure
    # a kill while round 1 was queued left out its baseline: #13's slot there pairs with nothing
    cut = _measured([(0, 0), (0, 13), (1, 13)])
    assert sorted(plan_rounds(cut, [0, 13], 2, 0)) == [(2, 0), (2, 13)]


def test_a_verdict_counts_the_winners_own_rounds_and_states_a_stable_baseline():
    base = [7279.3, 7279.8, 7280.9, 7286.2, 7281.0]
    late, early = [None, None, 10_400.0, 10_410.0, 10_390.0], [10_690.0, 10_780.0, None, None, None]
    v = judge(base, {26: late, 13: early})
    assert v.winner == 13 and "over 2 rounds" in v.verdict  # its own rounds, not the baseline's 5
    assert "varied 0.04% between rounds" in v.verdict


def test_rounds_measured_on_several_devices_are_said(tmp_path) -> None:
    """The H200 study of 2026-12-06 as if its rounds had run on several GPUs."""
    import json
    import shutil
    import sqlite3
    from pathlib import Path

    import optuna

    from autotune.analysis.verdict import study_verdict
    from autotune.output.show import format_show, show_doc
    from autotune.study.validation import load_validation, measurements

    db = tmp_path / "s7b.db"
    shutil.copy(Path(__file__).parents[1] / "benchmarks/results/h200-2026-12-06-study/s7b.db", db)
    url = f"sqlite:///{db}"
    val = load_validation(optuna.load_study(study_name="s7b", storage=url))
    assert val is not None
    base = {m.number for m in measurements(val) if m.validates == 0}
    ids = {t.number: t._trial_id for t in val.get_trials(deepcopy=False)}

    def place(gpu_of) -> str:
        """Each measurement on the GPU ``gpu_of`` names; the study's ``show``."""
        with sqlite3.connect(db) as con:
            con.execute("DELETE FROM trial_user_attributes WHERE key = 'machine'")
            for m in measurements(val):
                machine = {"host": "h", "gpu_uuids": [gpu_of(m)]}
                con.execute(
                    "INSERT INTO trial_user_attributes (trial_id, key, value_json) VALUES (?, ?, ?)",
                    (ids[m.number], "machine", json.dumps(machine)),
                )
        study = optuna.load_study(study_name="s7b", storage=url)  # a loaded study caches trials
        return format_show(show_doc(study, url))

    # round 2 cut off after the defaults, and finished on another GPU
    text = place(lambda m: "GPU-a" if m.round == 0 or m.number in base else "GPU-b")
    v = study_verdict(optuna.load_study(study_name="s7b", storage=url))
    assert v is not None and v.mixed_rounds == ((3, 2), (10, 2))
    clause = "#3 in round 2, #10 in round 2 measured on another GPU or machine than vLLM's defaults"
    assert clause in v.verdict and clause in text
    assert [list(p) for p in v.to_dict()["mixed_rounds"]] == [[3, 2], [10, 2]]

    # each round on a GPU of its own: each ratio compares measurements of one GPU
    place(lambda m: f"GPU-{m.round}")
    v = study_verdict(optuna.load_study(study_name="s7b", storage=url))
    assert v is not None and v.mixed_rounds == () and "another GPU" not in v.verdict

    # a measurement without a value gives no ratio to doubt: #10's round 2 failed, on GPU-b
    failed = next(m.number for m in measurements(val) if m.validates == 10 and m.round == 1)
    with sqlite3.connect(db) as con:
        con.execute("UPDATE trials SET state = 'FAIL' WHERE trial_id = ?", (ids[failed],))
        con.execute("DELETE FROM trial_values WHERE trial_id = ?", (ids[failed],))
    place(lambda m: "GPU-b" if m.number == failed else "GPU-a")
    v = study_verdict(optuna.load_study(study_name="s7b", storage=url))
    assert v is not None and v.mixed_rounds == ()
