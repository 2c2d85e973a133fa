"""Config-only checkpoints of real architectures, for vLLM's ``load_format="dummy"``.

A directory holding ``config.json`` (and a ``generation_config.json`` with the token ids only)
is enough for ``LLM(model=DIR, load_format="dummy", skip_tokenizer_init=True)``: vLLM builds the
model from the config and fills random weights, which run at the same speed as real ones. The
configs are the published ones of the Hugging Face checkpoints.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.atomic import write_json_atomic

_LLAMA_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-05,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "use_cache": True,
}

#: name -> config.json of meta-llama/Llama-2-7b-hf and meta-llama/Llama-3.2-1B
ARCHS: dict[str, dict[str, Any]] = {
    "llama2-7b": {
        **_LLAMA_COMMON,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "vocab_size": 32000,
        "torch_dtype": "float16",
    },
    "llama3.2-1b": {
        **_LLAMA_COMMON,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "hidden_size": 2048,
        "head_dim": 64,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": True,
        "vocab_size": 128256,
        "torch_dtype": "bfloat16",
    },
}


@dataclass(frozen=True)
class DenseShape:
    """The sizes of a dense decoder-only transformer (Llama family) that the roofline needs."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    dtype: str

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> DenseShape:
        """Read a ``config.json`` dict.

        Raises:
            ValueError: a mixture-of-experts or otherwise non-dense config (its counts would lie).
        """
        moe = [k for k in ("num_local_experts", "num_experts", "n_routed_experts") if cfg.get(k)]
        if moe:
            raise ValueError(f"{moe[0]}={cfg[moe[0]]}: mixture-of-experts models are not modelled")
        text = cfg.get("text_config")
        if isinstance(text, dict) and "hidden_size" not in cfg:
            cfg = text
        try:
            hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            return cls(
                hidden=hidden,
                layers=int(cfg["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                intermediate=int(cfg["intermediate_size"]),
                vocab=int(cfg["vocab_size"]),
                tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float16"),
            )
        except KeyError as e:
            raise ValueError(f"config.json lacks {e.args[0]!r}; not a dense decoder config") from None

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: q/k/v/o projections, gated MLP, two RMSNorms."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate
        return q_o + k_v + mlp + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All distinct weights (a tied LM head shares the embedding matrix)."""
        heads = 1 if self.tied_embeddings else 2
        return self.layers * self.layer_params + self.hidden + heads * self.embedding_params

    @property
    def kv_elements_per_token(self) -> int:
        """K and V elements one token keeps in the cache, over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim


def param_count(cfg: dict[str, Any]) -> int:
    """Distinct parameters of a dense Llama-family ``config.json`` dict."""
    return DenseShape.from_config(cfg).params


#: the files that mark a directory as holding a Hugging Face tokenizer
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


def write_arch(name: str, out_dir: str | Path, tokenizer: str | Path | None = None) -> Path:
    """Write the config-only checkpoint of ``name`` (a key of :data:`ARCHS`) into ``out_dir``.

    Args:
        name: The architecture.
        out_dir: The checkpoint directory to write.
        tokenizer: A directory holding a Hugging Face tokenizer to ship with it, for what needs
            text (a server and its benchmark client): its files are copied, and the model's
            vocabulary, BOS and EOS become the tokenizer's, so every token id the random weights
            sample decodes. The layers stay the architecture's; the embedding and LM head take
            the tokenizer's size (a small model's speed moves with it).
    """
    if name not in ARCHS:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHS)}")
    cfg = dict(ARCHS[name])
    out = Path(out_dir)
    if tokenizer is not None:
        from transformers import AutoTokenizer

        src = Path(tokenizer).expanduser()
        if not any((src / f).is_file() for f in TOKENIZER_FILES):
            raise ValueError(f"--tokenizer {src}: no tokenizer files there ({', '.join(TOKENIZER_FILES)})")
        tok = AutoTokenizer.from_pretrained(src)
        tok.save_pretrained(out)  # every file it needs, added tokens included
        cfg["vocab_size"] = len(tok)
        cfg["bos_token_id"], cfg["eos_token_id"] = tok.bos_token_id, tok.eos_token_id
    write_json_atomic(out / "config.json", cfg)
    # token ids only: sampling defaults here would be vLLM's defaults for requests without any
    write_json_atomic(
        out / "generation_config.json",
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]},
    )
    return out


def resolve_model(arch: str, out_dir: Path) -> tuple[Path, dict[str, Any]]:
    """``arch`` as a checkpoint directory and its config: a known name is written under
    ``out_dir/checkpoint-NAME``; anything else must be a directory with a ``config.json``."""
    if arch in ARCHS:
        path = write_arch(arch, out_dir / f"checkpoint-{arch}")
    else:
        path = Path(arch).expanduser()
        if not (path / "config.json").is_file():
            raise ValueError(f"--model-arch {arch}: not one of {', '.join(ARCHS)} and no config.json there")
    path = path.resolve()
    return path, json.loads((path / "config.json").read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.models",
        description="Write a config-only checkpoint for vLLM's load_format=dummy.",
    )
    parser.add_argument("arch", choices=sorted(ARCHS))
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer directory to ship with it")
    args = parser.parse_args(argv)
    print(write_arch(args.arch, args.out, args.tokenizer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
