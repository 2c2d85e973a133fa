from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.engine_info import EngineInfo, describe_engine
from autotune.tiny_model import build_tiny_llama


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
