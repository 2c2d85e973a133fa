"""vllm-autotune: a Bayesian auto-tuner for vLLM batch inference.

The parent process (this package) never imports vLLM; each trial runs in
``python -m autotune.trial.worker``, the one module that does.
"""

from autotune.errors import AutotuneError

__version__ = "0.1.0"
__all__ = ["AutotuneError", "__version__"]
