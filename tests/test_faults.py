"""Storage faults injected for real: a full disk (RLIMIT_FSIZE: writes past the limit fail with
EFBIG, as on a full disk), a studies directory that cannot be created, a SQLite database locked
by another process, and secrets in a storage URL. Each: a clear one-line error, no traceback, no
corrupt database."""

from __future__ import annotations

import json
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.helpers import autotune
from tests.synthetic import make_study


def _limited(limit_bytes: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``autotune ARGS`` with every file it writes capped at ``limit_bytes``."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=cap,
        check=False,
    )


def _clean(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for n in needles:
        assert n in proc.stderr, proc.stderr[-3000:]


def test_disk_full_while_the_study_database_is_created(engine, tmp_path: Path, tiny_model: Path):
    studies = tmp_path / "studies"
    args = ["run", "--model", str(tiny_model), "--study", "s", "--studies-dir", str(studies)]
    args += ["--space", "cpu"]
    full = _limited(16 * 1024, *args)
    _clean(full, "cannot open the study database", "disk full")
    db = studies / "s.db"
    if db.exists():  # whatever SQLite got down is consistent, and usable once there is room
        assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone() == ("ok",)
        optuna.create_study(study_name="s", storage=f"sqlite:///{db}")


def test_disk_full_while_exporting_keeps_the_previous_export(tmp_path: Path):
    db = tmp_path / "s.db"
    make_study(f"sqlite:///{db}", n=6, name="s")
    out = tmp_path / "best.json"
    args = ["export", "--study", "s", "--studies-dir", str(tmp_path), "--out", str(out), "--no-importance"]
    assert autotune(*args).returncode == 0
    before = out.read_text()
    full = _limited(256, *args)  # the export itself is larger than this
    _clean(full, "cannot read or write", "free space")
    assert out.read_text() == before and json.loads(before)["study"] == "s"  # atomic: old one intact
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".best.json")]  # no temp left


def test_studies_dir_that_cannot_be_created(tmp_path: Path, tiny_model: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = autotune(
        "run", "--model", str(tiny_model), "--study", "s", "--studies-dir", str(blocker / "studies")
    )
    _clean(proc, f"--studies-dir {blocker / 'studies'}: cannot create it", "writable directory")


@pytest.mark.slow  # SQLite's busy timeout is 30 s
@pytest.mark.timeout(300)
def test_sqlite_database_locked_by_another_process(tmp_path: Path):
    db = tmp_path / "s.db"
    make_study(f"sqlite:///{db}", n=3, name="s")
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # e.g. a DB browser in the middle of a write
    try:
        proc = autotune("show", "--study", "s", "--studies-dir", str(tmp_path))
    finally:
        other.execute("ROLLBACK")
        other.close()
    _clean(proc, "database is locked", "another process holds the SQLite database")
    again = autotune("show", "--study", "s", "--studies-dir", str(tmp_path))
    assert again.returncode == 0, again.stderr  # nothing was damaged


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_password_in_the_storage_url_is_never_printed_or_exported(
    postgres_url: str, tiny_model: Path, tmp_path: Path
):
    url = postgres_url.replace("autotune@", "autotune:s3cret-pw@")  # trust auth: any password works
    common = ["--study", "secret", "--storage", url, "--studies-dir", str(tmp_path)]
    run = autotune(
        "run", "--model", str(tiny_model), *common, "--space", "cpu", "--trials", "1",
        "--workload", "synthetic:count=8,input_len=16,output_len=8", "--no-bar",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "best.json"
    export = autotune("export", *common, "--out", str(out), "--no-importance")
    show = autotune("show", *common)
    ls = autotune("ls", "--storage", url)
    report = autotune("report", *common, "--out", str(tmp_path / "r.html"), "--jobs", "1")
    for proc in (run, export, show, ls, report):
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "s3cret-pw" not in proc.stdout + proc.stderr
    assert "***" in run.stderr  # the URL is shown, masked
    for f in [out, tmp_path / "r.html", *tmp_path.glob("secret/**/*.json")]:
        assert "s3cret-pw" not in f.read_text(errors="replace"), f


def test_a_database_error_during_a_run_is_one_line(monkeypatch, capsys):
    """Optuna wraps SQLAlchemy's errors in StorageInternalError mid-run (a lock held too long
    during ask(), a disk that filled up): still one line, with the hint, exit 2."""
    import sqlite3 as sq

    from sqlalchemy.exc import OperationalError

    from autotune import cli
    from autotune.cli import _commands

    def locked(args):
        try:
            raise OperationalError("INSERT ...", {}, sq.OperationalError("database is locked"))
        except OperationalError as e:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e

    monkeypatch.setattr(_commands, "cmd_show", locked)
    assert cli.main(["show", "--study", "s"]) == 2
    err = capsys.readouterr().err
    assert "database is locked; another process holds the SQLite database" in err
    assert "the same command resumes" in err and "Traceback" not in err
