"""Study storage URLs: the default SQLite file under ``studies/``, or any RDB URL Optuna takes."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.errors import StorageError

if TYPE_CHECKING:
    import optuna

_SCHEMES = ("sqlite", "postgresql", "mysql")
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


def redact(url: str) -> str:
    """The URL with its password hidden, for logs and exports."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """Open an Optuna RDB storage, with heartbeats so a killed worker's trial is failed later.

    Raises:
        StorageError: the URL is malformed, of an unsupported scheme, or unreachable.
    """
    import optuna
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

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
    if scheme == "sqlite" and parsed.database and parsed.database != ":memory:":
        db = Path(parsed.database)
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"--storage: cannot create {db.parent} for the SQLite file: {e}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=30,
                grace_period=120,
                engine_kwargs={"connect_args": {"timeout": 30}} if scheme == "sqlite" else {},
            )
    except (SQLAlchemyError, ImportError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StorageError(f"--storage {redact(url)!r}: cannot open the study database: {first}") from None
