"""Search spaces: YAML -> parameter specs -> Optuna suggestions, checked against ``EngineArgs``.

A space file::

    fixed:                       # engine args for every trial, the baseline included
      max_model_len: 4096
    parameters:
      max_num_seqs: {type: int, low: 64, high: 1024, log: true}
      gpu_memory_utilization: {type: float, low: 0.80, high: 0.95}
      block_size: {type: categorical, choices: [16, 32, 64]}
      enable_prefix_caching: {type: bool}
      tensor_parallel_size: {type: int, low: 1, high: gpus}   # bounded by the GPUs present
      max_num_partial_prefills: {type: int, low: 1, high: 4, optional: true}
    constraints:                 # extra rules, "name OP name-or-number"
      - max_num_batched_tokens >= max_num_seqs

``optional: true`` drops a parameter the installed vLLM lacks (instead of an error).
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from autotune._logging import get_logger
from autotune.errors import SearchSpaceError
from autotune.space.spec import TYPES, Constraint, ParamSpec, SearchSpace

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable
else:  # pragma: no cover
    from importlib.abc import Traversable

if TYPE_CHECKING:
    from autotune.space.engine_args import EngineInfo

_logger = get_logger(__name__)
_KEYS = {"type", "low", "high", "log", "step", "choices", "optional"}
#: Engine args the tuner sets itself or that make no sense to search.
_RESERVED = {"model"}
_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_]\w*)\s*(<=|>=|<|>|==|!=)\s*([A-Za-z_]\w*|-?\d+(?:\.\d+)?)\s*$")


def bundled_spaces() -> dict[str, Traversable]:
    """The search spaces shipped inside the package (``autotune/space/spaces/*.yaml``), by name."""
    root = resources.files("autotune.space") / "spaces"
    return {p.name.removesuffix(".yaml"): p for p in root.iterdir() if p.name.endswith(".yaml")}


def default_space(platform: str) -> str:
    """The bundled space for vLLM's platform: ``cpu`` on the CPU backend, ``throughput`` on GPUs."""
    return "cpu" if platform == "cpu" else "throughput"


def resolve_space_path(space: str | Path) -> Path | Traversable:
    """A space given by path, or by the name of a bundled one (``throughput``, ``cpu``)."""
    p = Path(space).expanduser()
    if p.is_file():
        return p
    bundled = bundled_spaces()
    if str(space) in bundled:
        return bundled[str(space)]
    known = ", ".join(sorted(bundled)) or "none: the package was installed without its data files"
    raise SearchSpaceError(f"--space {space}: no such file, and no bundled space of that name ({known})")


def load_space(
    space: str | Path | None,
    engine: EngineInfo,
    *,
    gpus: int = 1,
    extra_fixed: Mapping[str, Any] | None = None,
) -> SearchSpace:
    """Read, check and resolve a search space.

    Args:
        space: Path or bundled name of the YAML file; None for the platform's
            (:func:`default_space`).
        engine: The installed vLLM's engine arguments, to check every name and value against.
        gpus: GPUs one trial may use; the value of the symbol ``gpus`` in a range.
        extra_fixed: Engine args fixed on the command line; they override the file's ``fixed``.

    Raises:
        SearchSpaceError: naming the file, the field and the fix.
    """
    path = resolve_space_path(space if space is not None else default_space(engine.platform))
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SearchSpaceError(f"{path}: malformed YAML{where}: {problem}") from None
    except OSError as e:
        raise SearchSpaceError(f"{path}: cannot read: {e}") from None
    loaded = build_space(
        raw, engine, source=str(path), gpus=gpus, extra_fixed=extra_fixed, name=Path(path.name).stem
    )
    for message in defaults_outside(loaded, engine, source=str(path)):
        _logger.warning("%s", message)
    return loaded


def defaults_outside(space: SearchSpace, engine: EngineInfo, *, source: str = "<space>") -> list[str]:
    """Where vLLM's default for this machine is not strictly inside a searched range (or is not
    one of the choices): there the search can only find configs on one side of the baseline's.

    A range that starts at the smallest meaningful value (1, or 0 for a float) may start at the
    default: ``tensor_parallel_size`` cannot go below 1.
    """
    out = []
    for p in space.parameters:
        default = engine.default(p.name)
        if default is None or isinstance(default, bool) or p.type == "bool":
            continue
        where = f"{source}: parameters.{p.name}"
        if p.type == "categorical":
            if isinstance(default, (int, float, str)) and default not in p.choices:
                out.append(
                    f"{where}: vLLM's default here ({default!r}) is not one of the choices "
                    f"{list(p.choices)}; add it, so the search can stay at the default"
                )
            continue
        if not isinstance(default, (int, float)):
            continue
        assert p.low is not None and p.high is not None
        floor = 1 if p.type == "int" else 0
        if default >= p.high:
            out.append(
                f"{where}: vLLM's default here ({default}) is {'at' if default == p.high else 'above'} "
                f"the top of the range [{p.low}, {p.high}]: every config searched is below it; "
                f"widen 'high' above {default}"
            )
        elif default <= p.low and not (default == p.low <= floor):
            out.append(
                f"{where}: vLLM's default here ({default}) is {'at' if default == p.low else 'below'} "
                f"the bottom of the range [{p.low}, {p.high}]: every config searched is above it; "
                f"widen 'low' below {default}"
            )
    return out


def build_space(
    raw: Any,
    engine: EngineInfo,
    *,
    source: str = "<space>",
    gpus: int = 1,
    extra_fixed: Mapping[str, Any] | None = None,
    name: str = "custom",
) -> SearchSpace:
    """Check and resolve a parsed space mapping (the YAML's content); see :func:`load_space`."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SearchSpaceError(f"{source}: the top level must be a mapping with 'parameters:'")
    unknown_top = set(raw) - {"parameters", "fixed", "constraints", "description", "name"}
    if unknown_top:
        raise SearchSpaceError(
            f"{source}: unknown top-level key(s) {sorted(unknown_top)}; "
            "allowed: parameters, fixed, constraints, description"
        )
    params_raw = raw.get("parameters") or {}
    if not isinstance(params_raw, dict):
        raise SearchSpaceError(f"{source}: 'parameters' must be a mapping of engine arg -> spec")
    fixed_raw = raw.get("fixed") or {}
    if not isinstance(fixed_raw, dict):
        raise SearchSpaceError(f"{source}: 'fixed' must be a mapping of engine arg -> value")

    fixed: dict[str, Any] = {}
    for key, value in fixed_raw.items():
        _check_name(str(key), engine, f"{source}: fixed.{key}")
        fixed[str(key)] = value
    for key, value in (extra_fixed or {}).items():
        _check_name(str(key), engine, f"--set {key}")
        fixed[str(key)] = value

    params: list[ParamSpec] = []
    dropped: list[str] = []
    for key, spec in params_raw.items():
        key = str(key)
        where = f"{source}: parameters.{key}"
        if not isinstance(spec, dict):
            raise SearchSpaceError(f"{where}: must be a mapping like {{type: int, low: 1, high: 8}}")
        if spec.get("optional") and key not in engine.args:
            dropped.append(key)
            continue
        _check_name(key, engine, where)
        if key in fixed:
            continue  # fixed wins: the user pinned it
        p = _param(key, spec, where, engine, gpus)
        if p.type in ("int", "float") and p.low == p.high:
            fixed[key] = p.low
        elif p.type == "categorical" and len(p.choices) == 1:
            fixed[key] = p.choices[0]
        else:
            params.append(p)

    constraints_raw = raw.get("constraints") or []
    if not isinstance(constraints_raw, list):
        raise SearchSpaceError(
            f"{source}: 'constraints' must be a list like [max_num_batched_tokens >= max_num_seqs]"
        )
    constraints = []
    for i, c in enumerate(constraints_raw):
        constraints.append(_constraint(c, f"{source}: constraints[{i}]", engine))
    return SearchSpace(name, tuple(params), fixed, tuple(constraints), tuple(dropped))


def _check_name(name: str, engine: EngineInfo, where: str) -> None:
    if name in _RESERVED:
        raise SearchSpaceError(f"{where}: '{name}' is set by the tuner (use --model), not by a space")
    if name in engine.args:
        return
    close = difflib.get_close_matches(name, list(engine.args), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise SearchSpaceError(
        f"{where}: '{name}' is not an engine argument of the installed {engine.distribution} "
        f"{engine.vllm_version} (removed in vLLM V1, or misspelt){hint}"
    )


def _number(value: Any, where: str, key: str, gpus: int) -> float | int:
    if value == "gpus":
        return gpus
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SearchSpaceError(f"{where}: '{key}' must be a number (or 'gpus'), got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SearchSpaceError(f"{where}: '{key}' must be finite, got {value!r}")
    return value


def _param(key: str, spec: dict[str, Any], where: str, engine: EngineInfo, gpus: int) -> ParamSpec:
    extra = set(spec) - _KEYS
    if extra:
        raise SearchSpaceError(f"{where}: unknown key(s) {sorted(extra)}; allowed: {sorted(_KEYS)}")
    ptype = spec.get("type")
    if ptype not in TYPES:
        raise SearchSpaceError(f"{where}: 'type' must be one of {', '.join(TYPES)}, got {ptype!r}")
    arg = engine.args[key]
    if ptype == "bool":
        if arg.kind != "bool":
            raise SearchSpaceError(f"{where}: type bool, but vLLM's {key} is {arg.kind}")
        return ParamSpec(key, "bool")
    if ptype == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SearchSpaceError(f"{where}: categorical needs a non-empty 'choices' list")
        if len(set(map(repr, choices))) != len(choices):
            raise SearchSpaceError(f"{where}: 'choices' has duplicates: {choices}")
        for c in choices:
            if c is not None and not isinstance(c, (bool, int, float, str)):
                raise SearchSpaceError(f"{where}: choice {c!r} must be a scalar (bool/int/float/str/null)")
            _check_value(key, c, arg.kind, arg.choices, where)
        return ParamSpec(key, "categorical", choices=tuple(choices))
    if arg.kind not in ("int", "float") or (ptype == "float" and arg.kind == "int"):
        raise SearchSpaceError(f"{where}: type {ptype}, but vLLM's {key} is {arg.kind}")
    if "low" not in spec or "high" not in spec:
        raise SearchSpaceError(f"{where}: {ptype} needs 'low' and 'high'")
    low, high = _number(spec["low"], where, "low", gpus), _number(spec["high"], where, "high", gpus)
    log = bool(spec.get("log", False))
    step = spec.get("step")
    if ptype == "int":
        for k, v in (("low", low), ("high", high)):
            if int(v) != v:
                raise SearchSpaceError(f"{where}: int '{k}' must be a whole number, got {v}")
        low, high = int(low), int(high)
    if low > high:
        raise SearchSpaceError(f"{where}: low ({low}) is above high ({high})")
    if log and low <= 0:
        raise SearchSpaceError(f"{where}: log scale needs low > 0, got {low}")
    if step is not None:
        step = _number(step, where, "step", gpus)
        if step <= 0:
            raise SearchSpaceError(f"{where}: 'step' must be > 0, got {step}")
        if log:
            raise SearchSpaceError(f"{where}: 'step' and 'log: true' cannot be combined (Optuna)")
    return ParamSpec(key, ptype, low=low, high=high, log=log, step=step)


def _check_value(key: str, value: Any, kind: str, choices: tuple[Any, ...] | None, where: str) -> None:
    if value is None:
        return
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "str": isinstance(value, str),
    }.get(kind, True)
    if not ok:
        raise SearchSpaceError(f"{where}: choice {value!r} is not a valid {kind} for vLLM's {key}")
    if choices is not None and value not in choices:
        raise SearchSpaceError(
            f"{where}: {value!r} is not one of vLLM's choices for {key}: {', '.join(map(str, choices))}"
        )


def _constraint(text: Any, where: str, engine: EngineInfo) -> Constraint:
    m = _CONSTRAINT_RE.match(str(text)) if isinstance(text, str) else None
    if m is None:
        raise SearchSpaceError(
            f"{where}: {text!r} is not a rule of the form 'name OP name-or-number' "
            "(OP one of <=, >=, <, >, ==, !=), e.g. 'max_num_batched_tokens >= max_num_seqs'"
        )
    lhs, op, rhs = m.groups()
    for side in (lhs, rhs):
        if side[0].isalpha() or side[0] == "_":
            _check_name(side, engine, where)
    return Constraint(lhs, op, rhs)
