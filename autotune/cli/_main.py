"""Parse, dispatch, and turn every error a user can cause into one line and exit code 2."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Sequence

from autotune._logging import configure, get_logger
from autotune.errors import AutotuneError

_logger = get_logger(__name__)


def _interrupt(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM: every running trial stops (a second press: at once), then unwind."""
    from autotune.trial.process import request_stop

    request_stop()
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    from autotune.cli._parser import build_parser

    args = build_parser().parse_args(argv)
    configure(logging.DEBUG if args.debug else logging.INFO)
    func: Callable[[argparse.Namespace], int] = args.func
    # Ctrl-C, or a scheduler's or `timeout`'s SIGTERM, must take the running trials' process
    # groups down too: each runs in its own session, so only the runner can kill it, and
    # parallel trials wait in threads the signal never reaches
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        return func(args)
    except AutotuneError as e:
        return _error(args, str(e))
    except KeyboardInterrupt:
        print("autotune: interrupted; finished trials are saved, the same command resumes", file=sys.stderr)
        return 130
    except OSError as e:  # a disk that filled up, a directory that became read-only, ...
        where = f" {e.filename}" if e.filename else ""
        return _error(
            args,
            f"cannot read or write{where}: {e.strerror or e}; free space or fix permissions, then "
            "run the same command again (finished trials are saved)",
        )
    except Exception as e:
        # SQLAlchemy's errors, raised as such or wrapped by Optuna (StorageInternalError)
        cause = e.__cause__ if type(e).__name__ == "StorageInternalError" and e.__cause__ else e
        if not type(cause).__module__.startswith("sqlalchemy"):
            raise
        from autotune.study.storage import describe_db_error

        return _error(
            args,
            f"the study database failed: {describe_db_error(cause)} (finished trials are saved: "
            "its writes are transactional); the same command resumes",
        )


def _error(args: argparse.Namespace, message: str) -> int:
    """One line on stderr (the traceback too with --debug), exit code 2."""
    if args.debug:
        _logger.exception("error")
    print(f"autotune: error: {message}", file=sys.stderr)
    return 2
