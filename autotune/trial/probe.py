"""The quality probe: how far a config's next-token distributions drift from the baseline's.

After its timed run, a trial's worker scores a fixed set of sequences with its engine and writes
the top-k log-probabilities of every next token to ``probe.json``. The baseline trial makes the
sequences: the first prompts of the user's workload, each followed by the baseline's own greedy
continuation. Every later trial scores those same sequences (teacher forcing, vLLM's
``prompt_logprobs``), so the two probes compare position by position on the baseline's tokens:

- **mean KL divergence** KL(baseline || config) of the next-token distributions, in nats: the
  measure llama.cpp's ``--kl-divergence`` reports for quantized models. vLLM returns the top-k
  log-probabilities, not the whole vocabulary, so the KL is taken over the tokens both top-k
  lists hold plus one bucket for all the rest. Merging tokens into a bucket never increases a KL
  divergence (the log-sum inequality), so this is a lower bound of the full-vocabulary value,
  tight when the top-k hold nearly all the mass (k = 20 does on real models);
- **top-1 agreement**: the share of positions where both put the same token first.

A lossless change (batch size, block size, eager vs compiled) moves these only by floating-point
noise; fp8 weights or an fp8 KV cache move them measurably. Nothing here imports vLLM: the
worker writes the probe, the parent compares two.
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROBE_FILE = "probe.json"
#: how many of the workload's prompts the probe scores, and how many tokens the baseline writes
DEFAULT_PROBE = {"prompts": 16, "tokens": 32, "max_prompt_tokens": 512, "logprobs": 20}


@dataclass(frozen=True)
class Quality:
    """How a config's probe compares with the baseline's.

    Attributes:
        kl_mean: Mean KL(baseline || config) over the probed positions, nats (a lower bound).
        kl_max: The largest KL at one position.
        top1: Share of positions whose most likely token is the baseline's.
        positions: Positions compared.
        reference: The trial whose probe was the reference (the baseline).
    """

    kl_mean: float
    kl_max: float
    top1: float
    positions: int
    reference: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Quality | None:
        if not data or "kl_mean" not in data:
            return None
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class ProbeMismatch(ValueError):
    """Two probes did not score the same sequences (one of them is not the other's reference)."""


def scored_sequence(
    prompt_len: int, token_ids: list[int], positions: list[Any], text: str | None
) -> dict[str, Any]:
    """One sequence of a probe file: the top log-probabilities at each position after the prompt.

    Args:
        positions: Per position after the prompt, ``{token id: log-probability}`` (None where the
            engine gave none); ids and values as the engine returned them.
    """
    # 1e-5 nats: far below any drift that matters, and the study stores the reference
    top = [{str(t): round(float(lp), 5) for t, lp in (pos or {}).items()} for pos in positions]
    return {"prompt_len": prompt_len, "token_ids": token_ids, "top": top, "text": text}


def read_probe(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def pack(probe: dict[str, Any]) -> str:
    """``probe`` as one compact string (zlib, base64) a study can store for every host to read."""
    raw = json.dumps(probe, separators=(",", ":")).encode()
    return base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def unpack(packed: str) -> dict[str, Any]:
    """The probe :func:`pack` packed.

    Raises:
        ValueError: ``packed`` is not a packed probe.
    """
    try:
        probe = json.loads(zlib.decompress(base64.b64decode(packed)))
    except (zlib.error, ValueError, TypeError) as e:
        raise ValueError(f"not a packed probe: {e}") from e
    if not isinstance(probe, dict) or "sequences" not in probe:
        raise ValueError("not a packed probe: it has no sequences")
    return probe


#: the least probability a token is given: a candidate that gives the baseline's token nothing
#: (``-inf``) or garbage (``NaN``) scores the KL it would at this floor, a large finite value
_FLOOR = math.log(1e-12)


def _finite(d: dict[str, float]) -> dict[str, float]:
    """Log-probabilities with ``-inf`` and ``NaN`` (a broken config's output) put at the floor."""
    return {t: v if math.isfinite(v) and v > _FLOOR else _FLOOR for t, v in d.items()}


def _kl(p: dict[str, float], q: dict[str, float]) -> float:
    """KL(p || q) over the tokens both top-k lists hold plus one bucket for the rest (nats)."""
    p, q = _finite(p), _finite(q)
    common = p.keys() & q.keys()
    kl = 0.0
    for t in common:
        kl += math.exp(p[t]) * (p[t] - q[t])
    p_rest = max(0.0, 1.0 - sum(math.exp(p[t]) for t in common))
    q_rest = max(0.0, 1.0 - sum(math.exp(q[t]) for t in common))
    if p_rest > 1e-9:
        kl += p_rest * (math.log(p_rest) - math.log(max(q_rest, 1e-12)))
    return max(0.0, kl)


def _same_top(p: dict[str, float], q: dict[str, float]) -> bool:
    """Whether ``q`` ranks the baseline's first token first too (a tie for first counts)."""
    p, q = _finite(p), _finite(q)
    first = max(p, key=lambda t: p[t])
    return first in q and q[first] >= max(q.values())


def compare(
    reference: dict[str, Any], candidate: dict[str, Any], reference_trial: int | None = None
) -> Quality:
    """Compare ``candidate``'s probe with ``reference``'s (both as written by the worker).

    Raises:
        ProbeMismatch: they scored different sequences.
    """
    ref_seqs, cand_seqs = reference["sequences"], candidate["sequences"]
    if len(ref_seqs) != len(cand_seqs):
        raise ProbeMismatch(f"{len(cand_seqs)} probe sequences, the reference has {len(ref_seqs)}")
    kls: list[float] = []
    same = 0
    for r, c in zip(ref_seqs, cand_seqs, strict=True):
        if r["token_ids"] != c["token_ids"] or len(r["top"]) != len(c["top"]):
            raise ProbeMismatch("a probe sequence differs from the reference's")
        for p, q in zip(r["top"], c["top"], strict=True):
            if not p or not q:
                continue
            kls.append(_kl(p, q))
            same += _same_top(p, q)
    if not kls:
        raise ProbeMismatch("the probes have no positions to compare")
    return Quality(
        kl_mean=sum(kls) / len(kls),
        kl_max=max(kls),
        top1=same / len(kls),
        positions=len(kls),
        reference=reference_trial,
    )
