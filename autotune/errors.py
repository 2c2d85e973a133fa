"""The error hierarchy. Every error a user can cause derives from :class:`AutotuneError`.

The CLI prints an ``AutotuneError`` as one line (no traceback) and exits with code 2, so each
message names the field at fault and says how to fix it.
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Root of all errors raised by vllm-autotune on bad input or an unusable environment."""


class SearchSpaceError(AutotuneError):
    """The search-space YAML is malformed, names an unknown engine argument or a bad range."""


class WorkloadError(AutotuneError):
    """The workload specification or file is unusable (missing, empty, malformed)."""


class StorageError(AutotuneError):
    """The study storage URL is malformed or the storage cannot be opened."""


class ModelError(AutotuneError):
    """The model argument points at nothing usable."""


class StudyError(AutotuneError):
    """The study is missing, or its stored settings conflict with the command line."""


class EngineError(AutotuneError):
    """The installed vLLM cannot be found or described."""


class PlacementError(AutotuneError):
    """``--gpus`` / ``--gpus-per-trial`` don't describe a usable split of this machine's GPUs."""


class ImportanceError(AutotuneError):
    """Parameter importance cannot be computed (a missing dependency, an unusable study)."""


class ReportError(AutotuneError):
    """The report cannot be built (matplotlib missing, a study vllm-autotune did not make)."""


class ServeError(AutotuneError):
    """Serve mode's options (``--concurrency``, ``--request-rate``, ``--slo``) are unusable."""
