"""Build a tiny random-weight Llama model and tokenizer on local disk.

Model hubs are often unreachable (CI, air-gapped clusters), yet a real engine run needs a real
checkpoint. This writes one: a BPE tokenizer trained on generated text and a Llama of about a
million parameters with random weights, in the Hugging Face layout that vLLM loads.
"""

from __future__ import annotations

import random
from pathlib import Path

_TEXT = (
    "the model reads a prompt and writes tokens one at a time while the scheduler packs many "
    "requests into each batch so the accelerator stays busy cache blocks hold keys and values "
    "for every sequence prefill is compute bound decode is memory bound throughput grows with "
    "batch size until memory runs out summarise this document in three sentences please"
)
_WORDS = tuple(_TEXT.split())


def _corpus(n_lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 40))) for _ in range(n_lines)]


def build_tiny_llama(
    out_dir: str | Path,
    *,
    vocab_size: int = 512,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    max_position_embeddings: int = 2048,
    seed: int = 0,
) -> Path:
    """Write a random-weight Llama checkpoint plus tokenizer to ``out_dir``.

    Args:
        out_dir: Directory to create (an existing checkpoint there is kept as is).
        vocab_size: Size of the BPE vocabulary to train.
        hidden_size: Model width; ``hidden_size / num_heads`` must be a head size the CPU
            attention backend accepts (32, 64, 80, 96, 112, 128, ...).
        num_layers: Decoder layers.
        num_heads: Attention heads (also used as the number of KV heads).
        max_position_embeddings: Longest context the model accepts.
        seed: Seed for the tokenizer corpus and the weights.

    Returns:
        The checkpoint directory, ready for ``vllm.LLM(model=str(path))``.
    """
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)

    special = ["<unk>", "<s>", "</s>"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(2000, seed), trainer=trainer)
    from tokenizers import decoders

    bpe.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=bpe.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype=torch.bfloat16)  # type: ignore[call-arg,arg-type]
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" would clutter the demo's output
    model.save_pretrained(out, safe_serialization=True)
    return out
