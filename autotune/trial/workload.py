"""Workloads: the same prompts for every trial of a study, so configs compete on equal work.

Three kinds, written as a ``--workload`` spec:

- ``synthetic:count=1000,input_len=256,output_len=256[,prefix_len=0][,seed=0]`` random token ids
  (generated inside the worker once the vocabulary is known; seeded, so identical every trial);
  ``prefix_len`` tokens at the start are shared by every prompt (where prefix caching pays);
- ``jsonl:PATH[,count=N][,output_len=N]``: one JSON object a line, ``{"prompt": "..."}`` or
  ``{"prompt_token_ids": [...]}``, optionally with ``"output_len"``;
- ``sharegpt:PATH[,count=N][,output_len=N]``: ShareGPT JSON (a list of ``{"conversations":
  [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}``); the first human turn is
  the prompt and, unless ``output_len`` is given, the reply's token count is the output length.

A bare path is taken as ``jsonl:`` for ``*.jsonl`` and ``sharegpt:`` for ``*.json``. Every request
generates exactly its output length (``ignore_eos``).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from autotune.errors import WorkloadError

Kind = Literal["synthetic", "jsonl", "sharegpt"]
_KINDS: tuple[str, ...] = ("synthetic", "jsonl", "sharegpt")
_INT_KEYS = {"count", "input_len", "output_len", "prefix_len", "seed"}
_ALLOWED = {
    "synthetic": {"count", "input_len", "output_len", "prefix_len", "seed"},
    "jsonl": {"count", "output_len", "seed"},
    "sharegpt": {"count", "output_len", "seed"},
}
#: Upper bound on requests in one workload; more would only lengthen every trial.
MAX_REQUESTS = 1_000_000
#: output tokens of a file request that names none (no output_len, no reply to measure)
DEFAULT_OUTPUT_LEN = 256
_EXAMPLE = "e.g. --workload synthetic:count=1000,input_len=256,output_len=256"


@dataclass(frozen=True)
class WorkloadSpec:
    """A parsed ``--workload``; :meth:`to_dict` travels to the worker in the trial spec."""

    kind: Kind = "synthetic"
    count: int | None = 1000
    input_len: int = 256
    output_len: int | None = 256
    prefix_len: int = 0
    seed: int = 0
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.kind == "synthetic":
            extra = f", {self.prefix_len}-token shared prefix" if self.prefix_len else ""
            return (
                f"synthetic: {self.count} prompts x {self.input_len} tokens in, "
                f"{self.output_len} out{extra} (seed {self.seed})"
            )
        if self.output_len:
            out = f"{self.output_len} tokens out each"
        elif self.kind == "sharegpt":
            out = "each reply's length out"
        else:
            out = f"each line's output_len out, else {DEFAULT_OUTPUT_LEN} (output_len=N sets all)"
        return f"{self.kind}: {self.path} ({self.count or 'all'} prompts, {out})"


def parse_workload(spec: str) -> WorkloadSpec:
    """Parse a ``--workload`` string (see the module docstring); file kinds must exist."""
    text = spec.strip()
    if not text:
        raise WorkloadError(f"--workload is empty; {_EXAMPLE}")
    head, _, rest = text.partition(":")
    if head not in _KINDS:
        if text.endswith(".jsonl"):
            head, rest = "jsonl", text
        elif text.endswith(".json"):
            head, rest = "sharegpt", text
        else:
            raise WorkloadError(
                f"--workload {spec!r}: unknown kind {head!r}; use one of {', '.join(_KINDS)} "
                f"or a path ending in .jsonl/.json ({_EXAMPLE})"
            )
    parts = [p.strip() for p in rest.split(",")] if rest else []
    fields: dict[str, Any] = {"kind": head}
    if head != "synthetic":
        if not parts or "=" in parts[0]:
            raise WorkloadError(f"--workload {spec!r}: give the file, e.g. {head}:prompts.{head}")
        fields["path"] = parts.pop(0)
        fields["count"] = None
        fields["output_len"] = None
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or key not in _ALLOWED[head]:
            raise WorkloadError(
                f"--workload {spec!r}: bad option {part!r}; {head} takes "
                f"{', '.join(sorted(_ALLOWED[head]))} as key=value"
            )
        try:
            number = int(value)
        except ValueError:
            raise WorkloadError(f"--workload {spec!r}: {key} must be an integer, got {value!r}") from None
        low = 0 if key in ("prefix_len", "seed") else 1
        if number < low:
            raise WorkloadError(f"--workload {spec!r}: {key} must be >= {low}, got {number}")
        fields[key] = number
    wl = WorkloadSpec(**fields)
    if wl.count is not None and wl.count > MAX_REQUESTS:
        raise WorkloadError(f"--workload: count {wl.count} is above the limit of {MAX_REQUESTS}")
    if wl.kind == "synthetic" and wl.prefix_len >= wl.input_len:
        raise WorkloadError(
            f"--workload {spec!r}: prefix_len ({wl.prefix_len}) must be below input_len ({wl.input_len})"
        )
    if wl.path is not None:
        p = Path(wl.path).expanduser()
        if not p.is_file():
            raise WorkloadError(f"--workload: file {wl.path!r} does not exist or is not a file")
    return wl


def load_requests(wl: WorkloadSpec) -> list[dict[str, Any]]:
    """Read a file workload into request records ``{"prompt"|"prompt_token_ids", "output_len"?,
    "completion"?}``, sampled to ``count`` with the workload's seed. Synthetic workloads have no
    records (the worker generates them)."""
    if wl.kind == "synthetic":
        return []
    assert wl.path is not None
    path = Path(wl.path).expanduser()
    records = _read_jsonl(path) if wl.kind == "jsonl" else _read_sharegpt(path)
    if not records:
        raise WorkloadError(f"--workload: {wl.path} holds no usable prompt; it needs at least one")
    if wl.count is not None and wl.count < len(records):
        records = random.Random(wl.seed).sample(records, wl.count)
    if wl.output_len is not None:
        for r in records:
            r["output_len"] = wl.output_len
    if len(records) > MAX_REQUESTS:
        raise WorkloadError(
            f"--workload: {wl.path} has {len(records)} prompts, above the limit of {MAX_REQUESTS}; "
            "pass count=N to sample fewer"
        )
    return records


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    try:
        # "\n" only: str.splitlines() also breaks at U+0085, U+2028, ... which JSON strings may
        # hold raw, and line numbers would no longer match the user's editor
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"--workload: cannot read {path}: {e}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"--workload: {where} is not valid JSON ({e.msg})") from None
        if isinstance(obj, str):
            obj = {"prompt": obj}
        if not isinstance(obj, dict):
            raise WorkloadError(f'--workload: {where} must be a JSON object with a "prompt"')
        records.append(_request(obj, where))
    return records


def _request(obj: dict[str, Any], where: str) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    if isinstance(obj.get("prompt"), str) and obj["prompt"]:
        rec["prompt"] = obj["prompt"]
    elif isinstance(obj.get("prompt_token_ids"), list) and obj["prompt_token_ids"]:
        ids = obj["prompt_token_ids"]
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise WorkloadError(f"--workload: {where}: prompt_token_ids must be non-negative ints")
        rec["prompt_token_ids"] = ids
    else:
        raise WorkloadError(
            f'--workload: {where} needs a non-empty "prompt" string or "prompt_token_ids" list'
        )
    out = obj.get("output_len", obj.get("max_tokens"))
    if out is not None:
        if not isinstance(out, int) or isinstance(out, bool) or out < 1:
            raise WorkloadError(f"--workload: {where}: output_len must be a positive integer")
        rec["output_len"] = out
    return rec


def _read_sharegpt(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"--workload: cannot read {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise WorkloadError(
            f"--workload: {path} is not valid JSON (line {e.lineno}: {e.msg}); "
            "ShareGPT files are one JSON list"
        ) from None
    if not isinstance(data, list):
        raise WorkloadError(f"--workload: {path} must hold a JSON list of conversations (ShareGPT)")
    records = []
    for entry in data:
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        first, reply = conv[0], conv[1]
        if not (isinstance(first, dict) and isinstance(reply, dict)):
            continue
        prompt, completion = first.get("value"), reply.get("value")
        if isinstance(prompt, str) and prompt and isinstance(completion, str) and completion:
            records.append({"prompt": prompt, "completion": completion})
    return records
