"""Study storage URLs: the default SQLite file under ``studies/``, or any RDB URL Optuna takes."""

from __future__ import annotations

import importlib.util
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import StorageError

if TYPE_CHECKING:
    import optuna

_SCHEMES = ("sqlite", "postgresql", "mysql")
#: the pip package behind each scheme's default SQLAlchemy driver, for the "not installed" hint
_DRIVERS = {"postgresql": "psycopg (pip install 'vllm-autotune[postgres]')", "mysql": "pymysql"}
DEFAULT_HEARTBEAT_S = 30
#: a running trial whose worker missed this many heartbeats is presumed dead
GRACE_HEARTBEATS = 4
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_study_name(name: str) -> str:
    """A study name is also a directory name: letters, digits, ``.``, ``_``, ``-`` only."""
    if not _NAME_RE.match(name) or ".." in name:
        raise StorageError(
            f"--study {name!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit (it names a directory under studies/)"
        )
    return name


def default_url(study: str, studies_dir: Path) -> str:
    return f"sqlite:///{studies_dir / f'{study}.db'}"


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///FILE`` URL; None for other storages (and in-memory)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def redact(url: str) -> str:
    """The URL with its password hidden, for logs and exports."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def describe_db_error(error: BaseException) -> str:
    """The first line of a database error, with what to do about the common ones."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    low = first.lower()
    if "locked" in low:
        return f"{first}; another process holds the SQLite database: close it, or wait and retry"
    if any(k in low for k in ("disk i/o", "disk is full", "readonly", "read-only", "unable to open")):
        return (
            f"{first}; is the disk full or the directory read-only? Free space, or use another --studies-dir"
        )
    return first


def open_storage(
    url: str,
    *,
    heartbeat_s: int = DEFAULT_HEARTBEAT_S,
    on_stale: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None = None,
) -> optuna.storages.BaseStorage:
    """Open an Optuna RDB storage, with heartbeats so a dead worker's trial is failed later.

    Args:
        url: SQLAlchemy URL (``sqlite:///...``, ``postgresql://user:pw@host/db``, ...).
        heartbeat_s: seconds between a running trial's heartbeats; a trial silent for
            ``GRACE_HEARTBEATS`` times as long is failed by the next worker that starts a trial.
        on_stale: called with each trial failed that way (e.g. to queue its config again).

    Raises:
        StorageError: the URL is malformed, of an unsupported scheme, or unreachable.
    """
    import optuna
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, IntegrityError, ProgrammingError, SQLAlchemyError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StorageError(
            f"--storage {redact(url)!r} is not a database URL; e.g. sqlite:///studies/s.db or "
            "postgresql://user@host/db"
        ) from None
    scheme = parsed.get_backend_name()
    if scheme not in _SCHEMES:
        raise StorageError(
            f"--storage {redact(url)!r}: unsupported scheme {scheme!r}; use one of {', '.join(_SCHEMES)}"
        )
    driver_url = url
    if parsed.drivername == "postgresql" and importlib.util.find_spec("psycopg") is not None:
        # the [postgres] extra installs psycopg 3, SQLAlchemy before 2.1 defaults to psycopg2
        driver_url = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if scheme == "sqlite" and parsed.database and parsed.database != ":memory:":
        db = Path(parsed.database)
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"--storage: cannot create {db.parent} for the SQLite file: {e}") from None
    engine_kwargs: dict[str, Any] = (
        {"connect_args": {"timeout": 30}}
        if scheme == "sqlite"
        # a server may drop idle connections during an hour-long trial
        else {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}}
    )
    for attempt in range(1, 6):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    driver_url,
                    heartbeat_interval=heartbeat_s,
                    grace_period=GRACE_HEARTBEATS * heartbeat_s,
                    heartbeat_stale_trial_callback=on_stale,
                    engine_kwargs=engine_kwargs,
                )
        except ImportError as e:
            raise StorageError(
                f"--storage {redact(url)!r}: the {scheme} driver is not installed ({e}); install "
                f"{_DRIVERS.get(scheme, 'its SQLAlchemy driver')}"
            ) from None
        except (IntegrityError, ProgrammingError) as e:
            # workers starting together on a new database all create Optuna's tables: one wins
            error: Exception = e
            time.sleep(0.5 * attempt)
        except (SQLAlchemyError, ValueError) as e:
            error = e
            break
    raise StorageError(
        f"--storage {redact(url)!r}: cannot open the study database: {describe_db_error(error)}"
    )
