"""``autotune ls`` / ``show``: the studies of a storage, and one study in detail."""

from __future__ import annotations

import copy
import shutil
import sqlite3
from pathlib import Path

import optuna
import pytest

from autotune.analysis.records import trial_rows
from autotune.errors import StudyError
from autotune.output.listing import format_list, list_studies, storage_urls, summarize_study
from autotune.output.show import format_show, show_doc
from autotune.study.lifecycle import open_study
from tests.synthetic import DEFAULTS, make_study

H200_DB = Path(__file__).resolve().parent.parent / "benchmarks/results/h200-2026-12-02/h200-llama2-7b.db"


def test_ls_reads_the_study_databases_of_a_directory(tmp_path):
    studies = tmp_path / "studies"
    studies.mkdir()
    for name, n in (("alpha", 6), ("beta", 3)):
        make_study(f"sqlite:///{studies / name}.db", n=n, seed=n, name=name, extra_failures=False)
    other = studies / "other.db"  # an SQLite file that is not Optuna's: left alone
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE notes (x TEXT)")
    con.close()
    (studies / "junk.db").write_text("not a database")
    before = other.read_bytes()

    urls = storage_urls(None, studies)
    assert [u.rsplit("/", 1)[-1] for u in urls] == ["alpha.db", "beta.db"]
    rows = list_studies(urls)
    assert [r.name for r in rows] == ["alpha", "beta"]
    alpha = rows[0]
    assert alpha.n_trials == 7 and sum(alpha.counts.values()) == 7
    assert alpha.best_value is not None and alpha.baseline_value is not None
    assert alpha.speedup == pytest.approx(alpha.best_value / alpha.baseline_value)
    text = format_list(rows)
    assert "alpha" in text and "beta" in text and f"x{alpha.speedup:.3f}" in text
    assert other.read_bytes() == before


def test_ls_one_storage_with_several_studies(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    make_study(url, n=4, name="one", extra_failures=False)
    make_study(url, n=4, name="two", extra_failures=False)
    optuna.create_study(study_name="foreign", storage=url)
    rows = list_studies(storage_urls(url, tmp_path))
    assert [r.name for r in rows] == ["foreign", "one", "two"]
    assert "(not an autotune study)" in format_list(rows)


def test_ls_says_where_to_look(tmp_path):
    with pytest.raises(StudyError, match="--studies-dir"):
        storage_urls(None, tmp_path)
    with pytest.raises(StudyError, match="--studies-dir"):
        storage_urls(None, tmp_path / "missing")


def test_show_missing_study(tmp_path):
    with pytest.raises(StudyError, match="autotune ls"):
        open_study("nope", None, tmp_path)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    make_study(url, n=2, name="present", extra_failures=False)
    with pytest.raises(StudyError, match="no study named 'nope'"):
        open_study("nope", url, tmp_path)


def test_rows_resolve_the_baseline_to_vllm_defaults():
    rows = trial_rows(make_study(n=3, seed=5))
    base = rows[0]
    assert base.role == "baseline" and base.speedup == pytest.approx(1.0)
    assert base.params["max_num_seqs"] == DEFAULTS["max_num_seqs"]
    assert base.params["kv_cache_dtype"] == DEFAULTS["cache_dtype"]  # engine attr calls it cache_dtype
    assert base.gpu_util_pct is not None


@pytest.mark.skipif(not H200_DB.is_file(), reason=f"{H200_DB} is not in this checkout")
def test_show_the_real_h200_study(tmp_path):
    db = tmp_path / "h200-llama2-7b.db"
    shutil.copy(H200_DB, db)
    rows = list_studies(storage_urls(None, tmp_path))
    assert len(rows) == 1 and rows[0].counts == {"COMPLETE": 12, "PRUNED": 0, "FAIL": 5}
    assert rows[0].best_trial == 13 and rows[0].speedup == pytest.approx(1.106, abs=1e-3)

    study, url = open_study("h200-llama2-7b", None, tmp_path)
    doc = show_doc(study, url)
    assert doc["best"]["trial"] == 13 and doc["baseline"]["trial"] == 0
    changes = {c["parameter"]: (c["baseline"], c["best"]) for c in doc["best_vs_baseline"]}
    assert changes["kv_cache_dtype"] == ("auto", "fp8")
    assert changes["max_num_seqs"] == (1024, 328)
    text = format_show(doc)
    assert "x1.106 over vLLM's defaults" in text
    assert "Concurrent Partial Prefill is not supported" in text
    assert "NVIDIA H200" in text and "max_num_seqs [64, 2048] log" in text


def test_show_says_which_trials_were_lost_retried_or_repeats():
    from optuna.distributions import IntDistribution

    from autotune.study.recovery import retry_stale
    from autotune.trial.record import DUPLICATE_ATTR

    study = make_study(n=2, seed=3)
    dist = {"max_num_seqs": IntDistribution(16, 1024, log=True)}
    lost = study.ask(dist)  # its worker died; a heartbeat check failed it
    study.tell(lost, state=optuna.trial.TrialState.FAIL)
    retry_stale(study, study.trials[lost.number])
    again = study.ask()
    study.tell(again, 5.0)
    repeat = study.ask(dist)
    repeat.set_user_attr(DUPLICATE_ATTR, again.number)
    repeat.set_user_attr("outcome", "duplicate")
    study.tell(repeat, 5.0)
    rows = {r.number: r for r in trial_rows(study)}
    assert rows[lost.number].outcome == "lost"
    assert f"ran again as #{again.number}" in rows[lost.number].error
    assert "heartbeats" in rows[lost.number].error
    assert rows[again.number].error.startswith(f"retry of #{lost.number}")
    assert rows[repeat.number].outcome == "duplicate"
    assert f"same config as #{again.number}" in rows[repeat.number].error
    assert "lost" in format_show(show_doc(study))


def test_show_says_a_timed_out_trial_ran_again():
    from optuna.distributions import IntDistribution

    from autotune.study.recovery import queue_retry
    from autotune.tuning.objective import COLD_RETRY_REASON

    study = make_study(n=2, seed=3)
    cold = study.ask({"max_num_seqs": IntDistribution(16, 1024, log=True)})
    cold.set_user_attr("outcome", "timeout")
    cold.set_user_attr("error", "the trial ran past its timeout and was killed")
    queue_retry(study, cold, COLD_RETRY_REASON)
    study.tell(cold, state=optuna.trial.TrialState.FAIL)
    again = study.ask()
    study.tell(again, 5.0)
    rows = {r.number: r for r in trial_rows(study)}
    assert rows[cold.number].outcome == "timeout"
    assert (
        rows[cold.number].error
        == f"the trial ran past its timeout and was killed; its config ran again as #{again.number}"
    )
    assert rows[again.number].error.startswith(f"retry of #{cold.number}")


def _with_machines(study: optuna.Study, machines: dict[int, dict]) -> optuna.Study:
    """``study`` anew, trial ``n`` with ``machines[n]`` (the rest with none recorded, as in trials
    of earlier releases)."""
    out = optuna.create_study(direction="maximize")
    for key, value in study.user_attrs.items():
        out.set_user_attr(key, value)
    for t in study.trials:
        t = copy.deepcopy(t)
        if t.number in machines:
            t.user_attrs["machine"] = machines[t.number]
        out.add_trial(t)
    return out


def test_show_marks_trials_measured_on_another_device_than_the_baseline():
    from autotune.analysis.records import OTHER_DEVICE
    from autotune.output.export import _validation
    from autotune.output.report.tables import trials_html
    from autotune.output.summary import format_summary
    from autotune.study.trials import summary

    here = {"host": "gpu-a", "gpu_uuids": ["GPU-aaaa"]}
    there = {"host": "gpu-a", "gpu_uuids": ["GPU-bbbb"]}  # another GPU of the same host
    synthetic = make_study(n=4, seed=3, extra_failures=False)
    study = _with_machines(synthetic, {0: here, 1: here, 2: there, 4: there})
    rows = {r.number: r for r in trial_rows(study)}
    assert [rows[n].other_device for n in range(5)] == [False, False, True, False, True]  # 3: unknown
    doc = show_doc(study)
    text = format_show(doc)
    assert "[other device]: #2, #4 measured on another GPU or machine than vLLM's defaults" in text
    assert [t["other_device"] for t in doc["trials"]] == [False, False, True, False, True]
    assert doc["best"]["trial"] == 2 and doc["best"]["other_device"]
    assert f"  ({OTHER_DEVICE})" in text
    assert OTHER_DEVICE in format_summary(summary(study))
    assert OTHER_DEVICE in _validation(None, other_device=True)["message"]
    html = trials_html(list(rows.values()), {}, Path("."))
    assert html.count("(other device)") == 2 and "×1.243 (other device)" in html
    listed = summarize_study(study, "mem")
    assert listed.other_device and "x1.243 (other device)" in format_list([listed])
    assert f"(other device): the best's run was {OTHER_DEVICE}" in format_list([listed])

    # where one side's GPUs are unknown (NVML failed there), or the baseline's machine is, it
    # says nothing either way; GPUs unknown on both sides compare by host
    for machines in (
        {0: {"host": "gpu-a"}, 2: there},
        {0: {}, 2: there},
        {0: {"host": "cpu-a"}, 2: {"host": "cpu-a"}},
    ):
        study = _with_machines(synthetic, machines)
        assert not any(r.other_device for r in trial_rows(study))
        assert "[other device]" not in format_show(show_doc(study))
        assert "(other device)" not in format_list([summarize_study(study, "mem")])
        assert OTHER_DEVICE not in format_summary(summary(study))
    study = _with_machines(synthetic, {0: {"host": "cpu-a"}, 2: {"host": "cpu-b"}})
    assert [r.number for r in trial_rows(study) if r.other_device] == [2]

    # a trial with no ratio (it failed or was pruned) is not marked: nothing to doubt
    failed = make_study(n=6, seed=3)
    rows = trial_rows(
        _with_machines(failed, {t.number: here if t.number == 0 else there for t in failed.trials})
    )
    assert {r.state for r in rows if not r.other_device} >= {"PRUNED"}
    assert all(r.state == "COMPLETE" for r in rows if r.other_device)


def test_a_repeat_is_marked_where_the_trial_it_repeats_ran():
    from optuna.distributions import IntDistribution

    from autotune.trial.record import DUPLICATE_ATTR

    base = make_study(n=1, seed=3, extra_failures=False)
    study = _with_machines(
        base, {0: {"host": "h", "gpu_uuids": ["GPU-a"]}, 1: {"host": "h", "gpu_uuids": ["GPU-b"]}}
    )
    repeat = study.ask({"max_num_seqs": IntDistribution(16, 1024, log=True)})
    repeat.set_user_attr(DUPLICATE_ATTR, 1)
    repeat.set_user_attr("outcome", "duplicate")
    study.tell(repeat, study.trials[1].value)
    assert [r.other_device for r in trial_rows(study)] == [False, True, True]


def test_the_machine_a_trial_ran_on(monkeypatch):
    import autotune.trial.telemetry as telemetry

    class FakeNvml:
        @staticmethod
        def nvmlDeviceGetHandleByIndex(i: int) -> int:
            if i == 3:
                raise RuntimeError("GPU is lost")
            return i

        @staticmethod
        def nvmlDeviceGetUUID(handle: int) -> bytes | str:
            return b"GPU-0000" if handle == 0 else f"GPU-{handle:04d}"

    monkeypatch.setattr(telemetry.socket, "gethostname", lambda: "node-1")
    monkeypatch.setattr(telemetry, "_nvml", lambda: FakeNvml)
    assert telemetry.machine([0, 2]) == {"host": "node-1", "gpu_uuids": ["GPU-0000", "GPU-0002"]}
    assert telemetry.machine([2, 3]) == {"host": "node-1"}  # one unreadable GPU: none named
    assert telemetry.machine([]) == {"host": "node-1"}  # a CPU trial
    monkeypatch.setattr(telemetry, "_nvml", lambda: None)
    assert telemetry.machine([0]) == {"host": "node-1"}
