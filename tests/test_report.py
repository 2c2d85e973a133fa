"""The HTML report: self-contained, escaped, atomic, and checked in a real headless Chromium."""

from __future__ import annotations

import base64
import html
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from autotune.analysis.importance import compute_importance, trial_table
from autotune.output.report import ReportError, render_report, scatter_figure, write_report
from tests.synthetic import DISTRIBUTIONS, draw, make_study

FAST = {"n_estimators": 30, "n_repeats": 2, "n_permutations": 1, "n_jobs": 1}
#: user YAML can put anything in a categorical choice; none of it may reach the page as markup
HOSTILE = "<script>alert('x')</script>&<b>$\\frac{$</b>"
CHROMIUM = shutil.which("chromium")
_IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def _hostile_study(tmp_path: Path) -> optuna.Study:
    study = make_study(n=30, seed=3, name="hostile", trial_root=str(tmp_path / "trials"))
    params = {**draw(np.random.default_rng(9)), "max_num_seqs": 16, "max_model_len": 256}
    dists = {**DISTRIBUTIONS, "tokenizer_mode": CategoricalDistribution([HOSTILE, "auto"])}
    trial_dir = tmp_path / "trials" / "hostile"
    trial_dir.mkdir(parents=True)
    (trial_dir / "stderr.log").write_text("the log\n")
    study.add_trial(
        optuna.trial.create_trial(
            params={**params, "tokenizer_mode": HOSTILE},
            distributions=dists,
            state=optuna.trial.TrialState.PRUNED,
            user_attrs={
                "outcome": "oom",
                "error": f"CUDA out of memory {HOSTILE}",
                "trial_dir": str(trial_dir),
            },
        )
    )
    return study


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("report")
    study = _hostile_study(tmp)
    out = write_report(study, tmp / "out" / "report.html", importance_kwargs=FAST)
    return out, out.read_text(encoding="utf-8")


def test_self_contained_with_every_section(page):
    _, text = page
    for section in ("history", "time", "importance", "scatter", "gpu", "best", "trials"):
        assert f'<section id="{section}">' in text
    images = _IMG.findall(text)
    assert len(images) == 5  # history, where the time goes, importances, objective vs params, GPU utilisation
    for data in images:
        assert base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n")
    # nothing outside the file: no scripts, no remote resources, a CSP that forbids both
    assert "<script" not in text
    assert not re.search(r'(src|href)="(https?:)?//', text)
    assert "default-src 'none'" in text
    assert "vLLM defaults (trial #0)" in text and "LLM(**kwargs)" in text


def test_user_text_is_escaped(page):
    _, text = page
    assert HOSTILE not in text
    assert html.escape(HOSTILE) in text
    assert "<b>$" not in text


def test_log_links(page, tmp_path):
    _, text = page
    # relative to the page (issue 20: absolute file:/// links broke once the report was shared)
    assert re.search(r'<a href="\.\./trials/hostile/stderr\.log" title="/[^"]+">stderr\.log</a>', text)
    assert "file:///" not in text
    # the synthetic trials' directories do not exist here: linked, and said so
    assert "(not here)" in text


def test_scatter_survives_mathtext_in_values(tmp_path):
    study = _hostile_study(tmp_path)
    assert scatter_figure(trial_table(study), ["tokenizer_mode"], "output_tokens_per_s") is not None


def test_few_trials_and_cpu(tmp_path):
    study = make_study(n=5, seed=1, name="tiny", telemetry=False)
    text = render_report(study, importance_kwargs=FAST)
    assert "not yet meaningful" in text
    assert "No GPU telemetry" in text and "CPU backend" in text
    assert len(_IMG.findall(text)) == 3  # history, time and objective vs params; no importances yet


def test_written_atomically(tmp_path):
    study = make_study(n=8, seed=4, name="atomic")
    report = compute_importance(study, **FAST)
    out = tmp_path / "r.html"
    out.write_text("old")
    write_report(study, out, importance=report)
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]  # no temporary left behind


def _chromium(tmp_path: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--enable-logging=stderr",
        "--v=0",
        *extra,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)


def _console(stderr: str) -> list[str]:
    """Console messages Chromium logged (``...:INFO:CONSOLE:N] "message", source: ...``)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get update && apt-get install -y chromium)"
)
def test_renders_in_headless_chromium(page, tmp_path):
    path, _ = page
    # the console check must be able to fail: a page that logs an error is caught
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><p>x</p><script>console.error("control-error")</script>')
    proc = _chromium(tmp_path, control.as_uri(), "--dump-dom")
    assert any("control-error" in line for line in _console(proc.stderr)), proc.stderr[-2000:]

    proc = _chromium(tmp_path, path.as_uri(), "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _console(proc.stderr) == [], "console messages on the report page"
    dom = proc.stdout
    assert len(_IMG.findall(dom)) == 5
    for heading in (
        "Optimisation history",
        "Where the time goes",
        "Parameter importance",
        "GPU utilisation per trial",
        "Trials",
    ):
        assert f"<h2>{heading}</h2>" in dom
    # the hostile value is text in the DOM, not an element (the serializer re-escapes < and & only)
    assert "&lt;script&gt;alert('x')&lt;/script&gt;&amp;&lt;b&gt;" in dom and "<script" not in dom

    shot = tmp_path / "shot.png"
    proc = _chromium(
        tmp_path, path.as_uri(), "--hide-scrollbars", "--window-size=1300,4000", f"--screenshot={shot}"
    )
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    import matplotlib.image

    pixels = (matplotlib.image.imread(str(shot))[..., :3] * 255).astype(int)

    def count(rgb: tuple[int, int, int]) -> int:
        return int((np.abs(pixels - np.array(rgb)).sum(axis=-1) < 40).sum())

    # the plots were decoded and painted: their blue points/bars and red OOM crosses are on screen
    assert count((0x1F, 0x77, 0xB4)) > 5000
    assert count((0xD6, 0x27, 0x28)) > 200


def test_foreign_study_is_a_clear_error():
    with pytest.raises(ReportError, match="not made by vllm-autotune"):
        render_report(optuna.create_study(study_name="foreign"))


def test_the_best_config_as_a_serve_command_and_in_words_when_nothing_beat_the_defaults(page, tmp_path):
    _, text = page
    assert "vllm serve /models/synthetic-7b" in text
    from tests.synthetic import make_study

    study = make_study(n=0, name="flat")  # the baseline alone: it is the best
    flat = render_report(study, importance_kwargs=FAST)
    headline = re.search(r"<p><b>(.*?)</b></p>", flat)
    assert headline and "Nothing beat vLLM&#x27;s defaults: the best is the baseline itself" in headline[1]


def test_a_validated_study_shows_its_rounds_and_verdict(tmp_path):
    """The committed H200 study with its validation rounds (2026-12-04): the verdict, the table
    of speedups with intervals, and a plot of every round."""
    db = (
        Path(__file__).resolve().parent.parent
        / "benchmarks/results/h200-2026-12-04-validation/h200-llama2-7b.db"
    )
    copy = tmp_path / "v.db"
    shutil.copy(db, copy)
    study = optuna.load_study(study_name="h200-llama2-7b", storage=f"sqlite:///{copy}")
    text = render_report(study, importance_kwargs=FAST)
    section = text[text.index('<section id="validation">') : text.index('<section id="importance">')]
    assert "trial #18 is faster than vLLM&#x27;s defaults: x1.214 (95 % CI 1.209-1.221)" in section
    assert "#18 (winner)" in section and "1.209–1.221" in section
    assert len(_IMG.findall(section)) == 1  # the rounds, beside the defaults'


def test_a_serve_study_crosses_out_its_slo_misses_in_the_history(tmp_path):
    """The H100 Pareto serve study of 2026-12-06: 4 of its 9 trials missed an SLO; the history
    marks them apart from the trials that met the SLOs, as the front does."""
    db = tmp_path / "pareto7b.db"
    shutil.copy(Path(__file__).parents[1] / "benchmarks/results/h100-2026-12-06-pareto/pareto7b.db", db)
    study = optuna.load_study(study_name="pareto7b", storage=f"sqlite:///{db}")
    text = write_report(study, tmp_path / "r.html", importance_kwargs=FAST).read_text(encoding="utf-8")
    assert "a cross missed an SLO (measured, never the best)" in text
    assert "Pareto front" in text
