"""The trial worker: ``python -m autotune.trial.worker SPEC.json`` runs one real vLLM benchmark.

This is the only module that imports vLLM. It runs in its own process (and process session),
started by :mod:`autotune.trial.runner`, and reports through :mod:`autotune.trial.protocol` on stdout:
validate the config with vLLM's own checks, start ``LLM(**engine_kwargs)``, warm up, time one
``generate()`` over the whole workload, report the metrics, score the quality probe (untimed),
shut the engine down.

``python -m autotune.trial.worker --describe`` prints the installed vLLM's engine arguments instead.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
import traceback
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.atomic import write_json_atomic
from autotune.trial import protocol
from autotune.trial.probe import DEFAULT_PROBE, PROBE_FILE, read_probe, scored_sequence
from autotune.trial.requests import build_requests, fit_requests
from autotune.trial.spec import DEFAULT_SAMPLING

_SCALARS = {bool: "bool", int: "int", float: "float", str: "str"}


def _kind(hint: Any) -> str:
    """``bool``/``int``/``float``/``str``/``other`` for a field's type hint."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        kinds = {_SCALARS.get(type(a), "other") for a in typing.get_args(hint)}
        return kinds.pop() if len(kinds) == 1 else "other"
    if origin is not None and args and origin not in (list, dict, set, tuple):
        # Optional[X] / X | None / Annotated
        kinds = {_kind(a) for a in args}
        return kinds.pop() if len(kinds) == 1 else "other"
    if isinstance(hint, str):  # an unresolved annotation such as "int | None"
        names = {t.strip() for t in hint.split("|")} - {"None"}
        if len(names) == 1 and (name := names.pop()) in _SCALARS.values():
            return name
        return "other"
    return _SCALARS.get(hint, "other") if isinstance(hint, type) else "other"


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def describe() -> dict[str, Any]:
    """The installed vLLM's ``EngineArgs`` fields, their kinds, defaults and CLI flags."""
    import argparse

    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from autotune.trial.installed import installed_distribution

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    actions = {a.dest: a for a in parser._actions}
    namespace = vars(sys.modules[EngineArgs.__module__])
    hints: dict[str, Any] = {}
    for f in dataclasses.fields(EngineArgs):
        try:  # per field: one unresolvable forward reference must not hide the others
            hints[f.name] = eval(f.type, namespace) if isinstance(f.type, str) else f.type
        except Exception:
            hints[f.name] = f.type
    args: dict[str, Any] = {}
    for f in dataclasses.fields(EngineArgs):
        if f.name.startswith("_"):
            continue
        action = actions.get(f.name)
        kind = _kind(hints.get(f.name, f.type))
        if kind == "other" and action is not None and action.choices:
            kinds = {_SCALARS.get(type(c), "other") for c in action.choices}
            kind = kinds.pop() if len(kinds) == 1 else "other"
        boolean_optional = isinstance(action, argparse.BooleanOptionalAction)
        store_true = isinstance(action, argparse._StoreTrueAction)
        if boolean_optional or store_true:
            kind = "bool"
        default = f.default if f.default is not dataclasses.MISSING else None
        flags = [s for s in action.option_strings if s.startswith("--")] if action else []
        args[f.name] = {
            "kind": kind,
            "default": _jsonable(default),
            "flags": flags,
            "boolean_optional": boolean_optional,
            "store_true": store_true,
            "choices": [_jsonable(c) for c in action.choices] if action and action.choices else None,
            "nargs": action.nargs if action else None,
        }
    if "attention_backend" in args:  # an enum argparse lists no choices for: its members' names
        args["attention_backend"]["choices"] = _attention_backends()
    dist, _ = installed_distribution()
    return {
        "vllm_version": vllm.__version__,
        "distribution": dist,
        "platform": str(current_platform.device_type or "unknown"),
        "args": args,
        "defaults": _platform_defaults(EngineArgs),
    }


def _attention_backends() -> list[str] | None:
    """The attention backends the installed vLLM knows (which ones run on this machine, model and
    config is decided at engine start: one that cannot is an invalid config, pruned)."""
    import importlib

    for module in ("vllm.v1.attention.backends.registry", "vllm.attention.backends.registry"):
        try:
            return [m.name for m in importlib.import_module(module).AttentionBackendEnum]
        except (ImportError, AttributeError):
            continue
    return None


def _platform_defaults(engine_args: Any) -> dict[str, Any]:
    """The defaults vLLM resolves for ``LLM(...)`` on this machine where the field says None
    (they depend on the platform and the GPU: ``max_num_seqs`` is 256 on the CPU, 1024 on an H200)."""
    from vllm.usage.usage_lib import UsageContext

    try:
        tokens, seqs = engine_args.get_batch_defaults(world_size=1)
    except Exception:  # an older vLLM without it, or a platform it cannot query
        return {}
    out = {
        "max_num_batched_tokens": tokens.get(UsageContext.LLM_CLASS),
        "max_num_seqs": seqs.get(UsageContext.LLM_CLASS),
    }
    return {k: v for k, v in out.items() if isinstance(v, int)}


def _engine_facts(llm: Any) -> dict[str, Any]:
    """The settings the engine actually resolved (vLLM fills many defaults per platform)."""
    return config_facts(llm.llm_engine.vllm_config)


def config_facts(cfg: Any) -> dict[str, Any]:
    """The settings of a resolved ``VllmConfig`` that a study shows and learns from; the KV
    cache's size (``num_gpu_blocks``, ``kv_cache_tokens``) once the engine has profiled."""
    picks = {
        "cache_config": (
            "block_size",
            "num_gpu_blocks",
            "enable_prefix_caching",
            "cache_dtype",
            "gpu_memory_utilization",
            "kv_cache_memory_bytes",
        ),
        "scheduler_config": (
            "max_num_seqs",
            "max_num_batched_tokens",
            "async_scheduling",
            "enable_chunked_prefill",
            "long_prefill_token_threshold",
            "max_num_partial_prefills",
        ),
        "model_config": ("max_model_len", "dtype", "enforce_eager", "quantization"),
        "parallel_config": ("tensor_parallel_size",),
        "compilation_config": ("max_cudagraph_capture_size", "cudagraph_mode", "mode"),
    }
    facts: dict[str, Any] = {}
    for section, names in picks.items():
        obj = getattr(cfg, section, None)
        for name in names:
            if obj is not None and hasattr(obj, name):
                value = getattr(obj, name)
                facts[name] = value if isinstance(value, (bool, int, float, type(None))) else str(value)
    if facts.get("num_gpu_blocks") and facts.get("block_size"):
        facts["kv_cache_tokens"] = int(facts["num_gpu_blocks"]) * int(facts["block_size"])
    return facts


def _requests(
    spec: dict[str, Any], llm: Any, tokenizer: Any, max_model_len: int
) -> tuple[list[Any], dict[str, int]]:
    """The workload's requests fitted to ``max_model_len``, and how many were shortened to fit."""
    records = []
    if spec.get("requests_file"):
        with open(spec["requests_file"], encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
    vocab = llm.llm_engine.model_config.get_vocab_size()
    requests = build_requests(spec["workload"], records, vocab, tokenizer)
    fitted = fit_requests(requests, tokenizer, max_model_len)
    shortened = sum(1 for (_, a), (_, b) in zip(requests, fitted, strict=True) if b < a)
    return fitted, {
        "requested_output_tokens": sum(n for _, n in requests),
        "shortened_requests": shortened,
    }


def _measure(llm: Any, requests: list[Any], spec: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """Warm up, then time one ``generate()`` over every request."""
    from vllm import SamplingParams

    sampling = {**DEFAULT_SAMPLING, **spec.get("sampling", {})}

    def params(n: int) -> Any:
        return SamplingParams(
            max_tokens=n,
            min_tokens=n,
            ignore_eos=True,
            temperature=sampling["temperature"],
            top_p=sampling["top_p"],
            detokenize=tokenizer is not None and sampling.get("detokenize", True),
        )

    protocol.emit("phase", phase="warmup", t=time.time())
    t0 = time.perf_counter()
    k = min(len(requests), int(spec.get("warmup_requests", 16)))
    if k:
        llm.generate(
            [p for p, _ in requests[:k]], [params(min(n, 16)) for _, n in requests[:k]], use_tqdm=False
        )
        # the timed run must not find the warm-up's prompts in the prefix cache: that would
        # favour small blocks and prefix caching itself, both of which are searched
        llm.reset_prefix_cache()
    warmup_s = time.perf_counter() - t0

    protocol.emit("phase", phase="generate", t=time.time())
    t0 = time.perf_counter()
    total = sum(n for _, n in requests)
    outputs = llm.generate(
        [p for p, _ in requests], [params(n) for _, n in requests], use_tqdm=_progress_bar(total)
    )
    generate_s = time.perf_counter() - t0
    prompt_tokens = sum(len(o.prompt_token_ids or ()) for o in outputs)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {
        "output_tokens_per_s": output_tokens / generate_s,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / generate_s,
        "requests_per_s": len(outputs) / generate_s,
        "generate_s": generate_s,
        "warmup_s": warmup_s,
        "num_requests": len(outputs),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
    }


#: progress events: one each time another 5 % of the requests have finished
PROGRESS_STEPS = 20
_OUTPUT_RATE = re.compile(r"output: ([0-9.]+) toks/s")


def _progress_bar(output_tokens: int) -> Any:
    """A progress bar for ``LLM.generate(use_tqdm=...)`` that draws nothing and emits a
    ``progress`` event each time another 1/``PROGRESS_STEPS`` of the requests has finished:
    ``LLM.generate`` stays the measured path, and the tuner sees how fast a trial goes (its
    pruner compares trials at the same share of the work). The rate is vLLM's own estimate,
    output tokens of the finished requests per second (else: that share of ``output_tokens``)."""
    import os

    from tqdm import tqdm

    class _Progress(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 - closed with the bar
            kwargs["mininterval"] = 1.0
            super().__init__(*args, **kwargs)
            self._step = 0

        def update(self, n: float | None = 1) -> bool | None:
            out = super().update(n)
            if self.desc != "Processed prompts" or not self.total:  # adding requests: no work yet
                return out
            step = int(self.n * PROGRESS_STEPS // self.total)
            if step > self._step:
                self._step = step
                elapsed = float(self.format_dict["elapsed"]) or 1e-9
                m = _OUTPUT_RATE.search(str(self.postfix or ""))
                rate = float(m.group(1)) if m else output_tokens * self.n / self.total / elapsed
                protocol.emit(
                    "progress", share=step / PROGRESS_STEPS, elapsed=elapsed, output_tokens_per_s=rate
                )
            return out

        def close(self) -> None:
            super().close()
            if self.fp is not None and not self.fp.closed:
                self.fp.close()

    return _Progress


def _token_ids(prompt: Any, tokenizer: Any) -> list[int]:
    if isinstance(prompt, dict):
        return list(prompt["prompt_token_ids"])
    if tokenizer is None:
        raise ValueError("the quality probe needs token ids or a tokenizer (skip_tokenizer_init is set)")
    return list(tokenizer(prompt).input_ids)


def _probe(llm: Any, requests: list[Any], spec: dict[str, Any], tokenizer: Any) -> None:
    """Score the probe's sequences and write ``probe.json`` (see :mod:`autotune.trial.probe`).

    Without a reference (the baseline) the sequences are the workload's first prompts, each
    followed by this engine's greedy continuation; with one, the reference's sequences.
    """
    from vllm import SamplingParams

    cfg = {**DEFAULT_PROBE, **spec["probe"]}
    protocol.emit("phase", phase="probe", t=time.time())
    k = min(int(cfg["logprobs"]), int(llm.llm_engine.model_config.max_logprobs))
    if cfg.get("reference"):
        reference = read_probe(cfg["reference"])
        seqs = [(int(s["prompt_len"]), list(s["token_ids"])) for s in reference["sequences"]]
        k = min(k, int(reference["logprobs"]))
    else:
        # the prompt's last tokens, leaving room for the continuation within max_model_len (this
        # engine's, and the least any trial of the study may run with: each scores the sequences)
        max_len = int(llm.llm_engine.model_config.max_model_len)
        max_len = min(max_len, int(cfg.get("max_len") or max_len))
        limit = max(1, min(int(cfg["max_prompt_tokens"]), max_len - int(cfg["tokens"]) - 1))
        prompts = [_token_ids(p, tokenizer)[-limit:] for p, _ in requests[: int(cfg["prompts"])]]
        greedy = SamplingParams(temperature=0.0, max_tokens=int(cfg["tokens"]), ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
        seqs = [(len(p), p + list(o.outputs[0].token_ids)) for p, o in zip(prompts, outs, strict=True)]
    score = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=k, detokenize=False)
    scored = llm.generate([{"prompt_token_ids": ids} for _, ids in seqs], score, use_tqdm=False)
    sequences = []
    for (n, ids), out in zip(seqs, scored, strict=True):
        positions = [{t: lp.logprob for t, lp in (pos or {}).items()} for pos in out.prompt_logprobs[n:]]
        text = tokenizer.decode(ids[n:]) if tokenizer is not None else None
        sequences.append(scored_sequence(n, ids, positions, text))
    write_json_atomic(Path(spec["trial_dir"]) / PROBE_FILE, {"logprobs": k, "sequences": sequences})


def run_probe(write: Callable[[], None]) -> None:
    """Run the quality probe (``write`` writes ``probe.json``) and report it, or why it failed:
    the parent judges a config without a probe."""
    try:
        write()
    except Exception as e:
        traceback.print_exc()
        protocol.emit("probe", error=f"{type(e).__name__}: {e}"[:1000])
    else:
        protocol.emit("probe", file=PROBE_FILE)


def preload() -> None:
    """Import what :func:`run` needs (``import vllm`` costs 9-25 s), touching no device: a fork
    server (:mod:`autotune.trial.forkserver`) does it once and forks trials from it."""
    import vllm  # noqa: F401
    from vllm import LLM, SamplingParams  # noqa: F401
    from vllm.engine.arg_utils import EngineArgs  # noqa: F401
    from vllm.usage.usage_lib import UsageContext  # noqa: F401


def device_initialised() -> bool:
    """Whether this process has initialised CUDA (a fork of it could not use the GPU); torch
    is vLLM's, imported by :func:`preload`."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def run(spec: dict[str, Any]) -> int:
    """Run one trial described by ``spec`` (see :mod:`autotune.trial.runner`); returns the exit code."""
    protocol.emit("phase", phase="import", t=time.time())
    import vllm
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    kwargs: dict[str, Any] = dict(spec["engine_kwargs"])
    protocol.emit("phase", phase="validate", t=time.time())
    try:
        EngineArgs(**kwargs).create_engine_config(usage_context=UsageContext.LLM_CLASS)
    except (ValueError, TypeError, NotImplementedError) as e:  # vLLM's own checks said no
        traceback.print_exc()
        protocol.emit("error", error_type="invalid_config", error=f"{type(e).__name__}: {e}"[:4000])
        return 3

    protocol.emit("phase", phase="engine_start", t=time.time())
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    engine_start_s = time.perf_counter() - t0
    try:
        facts = _engine_facts(llm)
        protocol.emit("engine", vllm_version=vllm.__version__, **facts)
        tokenizer = None if kwargs.get("skip_tokenizer_init") else llm.get_tokenizer()
        requests, fit = _requests(spec, llm, tokenizer, int(facts.get("max_model_len") or 1 << 30))
        metrics = _measure(llm, requests, spec, tokenizer)
        metrics.update(engine_start_s=engine_start_s, kv_cache_tokens=facts.get("kv_cache_tokens"))
        metrics.update(requested_output_tokens=fit["requested_output_tokens"])
        metrics.update(shortened_requests=fit["shortened_requests"])
        # reported first: what happens to the process from here on cannot lose the measurement
        protocol.emit("result", metrics=metrics)
        if spec.get("probe") is not None:  # outside the timed run
            run_probe(lambda: _probe(llm, requests, spec, tokenizer))
        protocol.emit("phase", phase="shutdown", t=time.time())
    finally:
        llm.llm_engine.engine_core.shutdown()
    return 0


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Kill this trial's whole process group once the tuner that started it is gone.

    The worker runs in its own session (so a terminal's Ctrl-C reaches only the tuner), which
    also means nothing else takes it down if the tuner is SIGKILLed; an orphaned engine would
    hold the GPU's memory forever.
    """
    import os
    import signal
    import threading

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="autotune-parent-watch", daemon=True).start()


def run_spec_file(
    argv: list[str], run_spec: Callable[[dict[str, Any]], int], usage: str, extra: str = ""
) -> int:
    """A trial worker's entry: watch the tuner, read ``SPEC.json`` (``argv``'s one item), run it;
    whatever escapes is reported as the trial's error."""
    import os

    parent = os.environ.get("AUTOTUNE_PARENT_PID", "")
    if parent.isdigit():
        watch_parent(int(parent))
    if len(argv) != 1:
        print(f"usage: python -m {usage} SPEC.json{extra}", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        return run_spec(spec)
    except BaseException as e:
        traceback.print_exc()
        protocol.emit("error", error_type=type(e).__name__, error=str(e)[:4000])
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--describe"]:
        protocol.emit("describe", info=describe())
        return 0
    return run_spec_file(argv, run, "autotune.trial.worker", " | --describe")


if __name__ == "__main__":
    sys.exit(main())
