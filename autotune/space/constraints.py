"""Cross-field rules a config must keep before an engine is started for it.

vLLM enforces these itself, but only after seconds (CPU) to minutes (GPU) of start-up; checking
them first means an impossible config costs nothing. Rules only fire when every field they
need is set explicitly (vLLM's defaults are resolved per platform inside the engine, and the
worker's validation step, which runs vLLM's own checks before any weights load, covers them).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping
from typing import Any

from autotune.errors import SearchSpaceError
from autotune.space.spec import Constraint, SearchSpace

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
    "==": operator.eq,
    "!=": operator.ne,
}


def _builtin(cfg: Mapping[str, Any], gpus: int) -> list[str]:
    out: list[str] = []
    seqs, tokens = cfg.get("max_num_seqs"), cfg.get("max_num_batched_tokens")
    if seqs is not None and tokens is not None and tokens < seqs:
        out.append(f"max_num_batched_tokens ({tokens}) must be >= max_num_seqs ({seqs})")
    max_len = cfg.get("max_model_len")
    no_chunking = cfg.get("enable_chunked_prefill") is False
    if no_chunking and tokens is not None and max_len is not None and tokens < max_len:
        out.append(
            f"without chunked prefill, max_num_batched_tokens ({tokens}) must be >= max_model_len ({max_len})"
        )
    partial, long_partial = cfg.get("max_num_partial_prefills"), cfg.get("max_long_partial_prefills")
    if partial is not None and long_partial is not None and long_partial > partial:
        out.append(
            f"max_long_partial_prefills ({long_partial}) must be <= max_num_partial_prefills ({partial})"
        )
    if partial is not None and partial > 1 and cfg.get("enable_chunked_prefill") is False:
        out.append("max_num_partial_prefills > 1 needs chunked prefill")
    threshold = cfg.get("long_prefill_token_threshold")
    if threshold is not None and max_len is not None and threshold > max_len:
        out.append(f"long_prefill_token_threshold ({threshold}) must be <= max_model_len ({max_len})")
    kv, dtype = str(cfg.get("kv_cache_dtype") or "auto"), str(cfg.get("dtype") or "auto")
    if kv.startswith("fp8") and dtype in ("float16", "half"):
        # vLLM 0.26 on H200: "For FP8 input, output must have dtype BF16"
        out.append(f"kv_cache_dtype={kv} needs dtype bfloat16, not {dtype}")
    tp = cfg.get("tensor_parallel_size")
    if tp is not None and tp > max(gpus, 1):
        out.append(f"tensor_parallel_size ({tp}) exceeds the {gpus} GPU(s) a trial may use")
    return out


def _side(cfg: Mapping[str, Any], token: str) -> Any:
    if token[0].isalpha() or token[0] == "_":
        return cfg.get(token)
    return float(token) if "." in token else int(token)


def violations(cfg: Mapping[str, Any], user: tuple[Constraint, ...] = (), *, gpus: int = 1) -> list[str]:
    """Every rule ``cfg`` breaks, as messages; empty when the config may be launched.

    A user rule whose fields are unset in ``cfg`` (left to vLLM's default) is not judged.
    """
    out = _builtin(cfg, gpus)
    for c in user:
        lhs, rhs = _side(cfg, c.lhs), _side(cfg, c.rhs)
        if lhs is None or rhs is None:
            continue
        try:
            ok = _OPS[c.op](lhs, rhs)
        except TypeError:
            ok = False
        if not ok:
            out.append(f"{c.text()} (here {lhs!r} {c.op} {rhs!r})")
    return out


def check_feasible(space: SearchSpace, *, gpus: int = 1, samples: int = 300, seed: int = 0) -> None:
    """Fail early when the constraints rule out (nearly) the whole space.

    Draws up to ``samples`` random configs and returns at the first one that breaks no rule.

    Raises:
        SearchSpaceError: every sampled config broke a rule; the message names the rules.
    """
    if not space.parameters:
        return
    import optuna

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    seen: dict[str, int] = {}
    for _ in range(samples):
        trial = study.ask()
        reasons = violations({**space.fixed, **space.suggest(trial)}, space.constraints, gpus=gpus)
        if not reasons:
            return
        for r in reasons:
            rule = r.split(" (here ")[0]
            seen[rule] = seen.get(rule, 0) + 1
        study.tell(trial, 0.0)
    worst = ", ".join(f"'{rule}' ({n}x)" for rule, n in sorted(seen.items(), key=lambda kv: -kv[1])[:3])
    raise SearchSpaceError(
        f"space {space.name}: constraints rule out all {samples} configs sampled from it, broken: "
        f"{worst}; loosen the constraints or the parameter ranges"
    )


#: parameters that can never exceed the context length (vLLM rejects the config)
_AT_MOST_MAX_MODEL_LEN = ("long_prefill_token_threshold",)


def bound_by_context(space: SearchSpace, max_model_len: int | None) -> tuple[SearchSpace, list[str]]:
    """The space without values that can only be invalid for a model of ``max_model_len`` tokens
    (``long_prefill_token_threshold`` above it), so no trial is spent on them; what was cut, in words.

    ``max_model_len`` is the space's fixed one if it has one, else the model's own context length.
    """
    fixed_len = space.fixed.get("max_model_len")
    bound = fixed_len if isinstance(fixed_len, int) and not isinstance(fixed_len, bool) else max_model_len
    if bound is None:
        return space, []
    params, notes = [], []
    for p in space.parameters:
        if p.name not in _AT_MOST_MAX_MODEL_LEN:
            params.append(p)
            continue
        if p.type == "categorical":
            keep = tuple(c for c in p.choices if not (isinstance(c, (int, float)) and c > bound))
            if len(keep) < len(p.choices) and keep:
                cut = [c for c in p.choices if c not in keep]
                notes.append(f"{p.name}: {cut} dropped, above max_model_len ({bound})")
                p = dataclasses.replace(p, choices=keep)
        elif p.type == "int" and p.high is not None and p.low is not None and p.low <= bound < p.high:
            notes.append(f"{p.name}: high {p.high} lowered to max_model_len ({bound})")
            p = dataclasses.replace(p, high=bound)
        params.append(p)
    return dataclasses.replace(space, parameters=tuple(params)), notes


def drop_requantization(space: SearchSpace, method: str | None) -> tuple[SearchSpace, list[str]]:
    """The space without ``quantization`` for a checkpoint quantized already (``method``): vLLM
    reads such weights as they are, and a second quantization is not a choice to search."""
    if method is None or not any(p.name == "quantization" for p in space.parameters):
        return space, []
    params = tuple(p for p in space.parameters if p.name != "quantization")
    note = f"quantization: not searched, the checkpoint's weights are quantized already ({method})"
    return dataclasses.replace(space, parameters=params), [note]
