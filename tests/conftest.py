from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.demo.tiny_model import build_tiny_llama
from autotune.space.engine_args import EngineInfo, describe_engine


@pytest.fixture(scope="session")
def engine() -> EngineInfo:
    """The installed vLLM's real engine arguments (read once, cached per installation)."""
    return describe_engine()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~1 M-parameter random-weight Llama plus BPE tokenizer, built locally (no hub)."""
    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]))
    return str(versions[-1]) if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real, throwaway PostgreSQL server on loopback (``AUTOTUNE_TEST_POSTGRES_URL`` to use
    one of yours). Skipped where PostgreSQL is not installed, unless ``AUTOTUNE_REQUIRE_POSTGRES``
    is set (CI), where that is a failure."""
    if url := os.environ.get("AUTOTUNE_TEST_POSTGRES_URL"):
        yield url
        return
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        if os.environ.get("AUTOTUNE_REQUIRE_POSTGRES"):
            pytest.fail("PostgreSQL is not installed (apt-get install postgresql)")
        pytest.skip("PostgreSQL is not installed")
    # not under pytest's tmp dir: as root that is private to root, and the server runs as postgres
    data = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        import pwd

        pw = pwd.getpwnam("postgres")
        os.chown(data, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    run = functools.partial(subprocess.run, check=True, capture_output=True, text=True, timeout=120)
    run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "autotune", "--no-sync"])
    opts = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    run([*as_user, pg_ctl, "-D", str(data), "-o", opts, "-l", str(data / "server.log"), "-w", "start"])
    try:
        yield f"postgresql://autotune@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What the tests measured on the real engine (e.g. a trial's seconds per phase), in CI's log."""
    from tests.helpers import REPORTS

    if REPORTS:
        terminalreporter.section("measured on the CPU engine (this machine)")
        for report in REPORTS:
            terminalreporter.write_line(report)
