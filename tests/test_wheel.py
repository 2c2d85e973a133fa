"""``pip install vllm-autotune`` from a wheel, not from this checkout: the bundled search spaces
travel as package data, and a real trial runs from the installed package alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parent.parent


def _run(*cmd: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_a_wheel_installed_in_a_fresh_venv_runs_a_real_trial(tmp_path: Path, tiny_model: Path):
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO), cwd=tmp_path)
    (wheel,) = dist.glob("vllm_autotune-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "autotune/space/spaces/throughput.yaml" in names and "autotune/space/spaces/cpu.yaml" in names

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", str(venv), cwd=tmp_path)
    py = venv / "bin" / "python"
    _run(str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel), cwd=tmp_path)
    # the dependencies (vLLM, Optuna, ...) come from this environment's site-packages, as a plain
    # path: its .pth files (this checkout's editable install among them) are not read from there
    site = Path(
        subprocess.check_output(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    where = _run(str(py), "-c", "import autotune; print(autotune.__file__)", cwd=tmp_path).stdout.strip()
    assert where.startswith(str(venv)), where

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    studies = tmp_path / "studies"
    proc = _run(
        str(venv / "bin" / "autotune"), "run", "--model", str(tiny_model), "--study", "w",
        "--studies-dir", str(studies), "--space", "cpu", "--trials", "1", "--no-bar",
        "--workload", "synthetic:count=8,input_len=16,output_len=8", "--trial-timeout", "300",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert "trial 1/1" in proc.stderr, proc.stderr[-3000:]
    result = json.loads((studies / "w" / "trials" / "0" / "result.json").read_text())
    assert result["outcome"] == "success" and result["metrics"]["output_tokens"] == 8 * 8
