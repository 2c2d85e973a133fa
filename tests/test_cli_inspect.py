from __future__ import annotations

import shutil
from pathlib import Path

from tests.helpers import autotune

H200_DB = Path(__file__).resolve().parent.parent / "benchmarks/results/h200-2026-12-02/h200-llama2-7b.db"


def test_ls_show_importance_report(tmp_path):
    studies = tmp_path / "studies"
    studies.mkdir()
    shutil.copy(H200_DB, studies / "h200-llama2-7b.db")
    common = ["--study", "h200-llama2-7b", "--studies-dir", str(studies)]
    assert "x1.106" in autotune("ls", "--studies-dir", str(studies)).stdout
    assert "x1.106 over vLLM's defaults" in autotune("show", *common).stdout
    imp = autotune("importance", *common, "--jobs", "1")
    assert imp.returncode == 0 and "max_num_partial_prefills" in imp.stdout, imp.stderr
    out = tmp_path / "r.html"
    rep = autotune("report", *common, "--out", str(out), "--jobs", "1")
    assert rep.returncode == 0 and out.read_text().startswith("<!DOCTYPE html>"), rep.stderr
