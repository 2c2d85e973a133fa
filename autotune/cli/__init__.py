"""The ``autotune`` command: ``run``, ``demo``, ``ls``, ``show``, ``importance``, ``report``, ``export``.

Every ``AutotuneError`` becomes one line on stderr and exit code 2; ``--debug`` adds tracebacks.
"""

from autotune.cli._main import main

__all__ = ["main"]
