"""The workload as the worker runs it: ``(prompt, output length)`` pairs, synthetic prompts
generated from their seed, every request fitted within the model's context."""

from __future__ import annotations

from typing import Any

from autotune.trial.workload import DEFAULT_OUTPUT_LEN


def build_requests(
    workload: dict[str, Any], records: list[dict[str, Any]], vocab_size: int, tokenizer: Any
) -> list[tuple[Any, int]]:
    """The workload as ``(prompt, output_len)`` pairs; synthetic prompts are generated here."""
    import numpy as np

    if workload["kind"] == "synthetic":
        rng = np.random.default_rng(workload["seed"])
        low = min(100, vocab_size // 10)
        prefix = rng.integers(low, vocab_size, size=workload["prefix_len"]).tolist()
        body = rng.integers(low, vocab_size, size=(workload["count"], workload["input_len"] - len(prefix)))
        return [({"prompt_token_ids": prefix + row}, workload["output_len"]) for row in body.tolist()]
    out: list[tuple[Any, int]] = []
    for rec in records:
        prompt: Any = rec["prompt"] if "prompt" in rec else {"prompt_token_ids": rec["prompt_token_ids"]}
        n = rec.get("output_len")
        if n is None and rec.get("completion") and tokenizer is not None:
            n = len(tokenizer(rec["completion"], add_special_tokens=False).input_ids)
        out.append((prompt, max(1, int(n or workload.get("output_len") or DEFAULT_OUTPUT_LEN))))
    return out


def fit_requests(
    requests: list[tuple[Any, int]], tokenizer: Any, max_model_len: int
) -> list[tuple[Any, int]]:
    """Keep every request within ``max_model_len`` by shortening its output, as a server would
    (the parent says how many were shortened: ``requested_output_tokens`` in the metrics)."""
    fitted = []
    for prompt, n in requests:
        if isinstance(prompt, dict):
            plen = len(prompt["prompt_token_ids"])
        elif tokenizer is not None:
            plen = len(tokenizer(prompt).input_ids)
        else:
            plen = 0
        if plen >= max_model_len:
            raise ValueError(
                f"a workload prompt has {plen} tokens, not below max_model_len ({max_model_len}); "
                "raise max_model_len (fixed: in the space) or use shorter prompts"
            )
        fitted.append((prompt, min(n, max_model_len - plen)))
    return fitted
