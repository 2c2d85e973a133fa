"""The package's one logging setup: a library logger whose lines don't break the progress bar."""

from __future__ import annotations

import logging
import sys

_LOGGER_NAME = "autotune"


def get_logger(name: str | None = None) -> logging.Logger:
    """Return the package logger, or a child of it for ``name`` (a module's ``__name__``)."""
    if name is None or name == _LOGGER_NAME:
        return logging.getLogger(_LOGGER_NAME)
    return logging.getLogger(name if name.startswith(_LOGGER_NAME + ".") else f"{_LOGGER_NAME}.{name}")


class _TqdmHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes through ``tqdm.write`` so log lines appear above a live progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def configure(verbosity: int = logging.INFO) -> None:
    """Send the package's log records to stderr at ``verbosity``; idempotent."""
    logger = get_logger()
    logger.setLevel(verbosity)
    if not any(isinstance(h, _TqdmHandler) for h in logger.handlers):
        handler = _TqdmHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[autotune] %(message)s"))
        logger.addHandler(handler)
    logger.propagate = False
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our own lines say it all
