"""A search space as the tuner uses it: typed parameters, fixed engine args and rules."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import optuna

ParamType = Literal["int", "float", "categorical", "bool"]
TYPES: tuple[str, ...] = ("int", "float", "categorical", "bool")


@dataclass(frozen=True)
class ParamSpec:
    """One searched engine argument."""

    name: str
    type: ParamType
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    def records(self, value: Any) -> bool:
        """Whether ``value`` can stand as this parameter's value in a trial: a categorical's must
        be one of its choices; a number must be one Optuna stores as it is (a whole number for an
        int, positive on a log range), where one outside the range only draws Optuna's warning."""
        if self.type == "bool":
            return isinstance(value, bool)
        if self.type == "categorical":
            return any(value == c and type(value) is type(c) for c in self.choices)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        whole = isinstance(value, int) or value.is_integer()  # Optuna stores 512.0 as 512, 512.5 too
        return (self.type == "float" or whole) and (value > 0 or not self.log)

    def distribution(self) -> optuna.distributions.BaseDistribution:
        """The Optuna distribution :meth:`suggest` draws from."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.type == "int":
            assert self.low is not None and self.high is not None
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        if self.type == "float":
            assert self.low is not None and self.high is not None
            return FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)
        if self.type == "bool":
            return CategoricalDistribution([False, True])
        return CategoricalDistribution(list(self.choices))

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.type == "int":
            assert self.low is not None and self.high is not None
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log
            )
        if self.type == "float":
            assert self.low is not None and self.high is not None
            return trial.suggest_float(
                self.name, float(self.low), float(self.high), step=self.step, log=self.log
            )
        if self.type == "bool":
            return trial.suggest_categorical(self.name, [False, True])
        return trial.suggest_categorical(self.name, list(self.choices))

    def describe(self) -> str:
        if self.type in ("int", "float"):
            return f"[{self.low}, {self.high}]" + (" log" if self.log else "")
        if self.type == "bool":
            return "{false, true}"
        return "{" + ", ".join(map(str, self.choices)) + "}"


@dataclass(frozen=True)
class Constraint:
    """A rule ``lhs op rhs`` over engine args (names or numbers) that a config must satisfy."""

    lhs: str
    op: str
    rhs: str

    def text(self) -> str:
        return f"{self.lhs} {self.op} {self.rhs}"


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space: what to search, what to fix, which rules to keep."""

    name: str
    parameters: tuple[ParamSpec, ...]
    fixed: dict[str, Any] = field(default_factory=dict)
    constraints: tuple[Constraint, ...] = ()
    dropped: tuple[str, ...] = ()

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        return {p.name: p.suggest(trial) for p in self.parameters}

    def smallest(self, name: str) -> int | None:
        """The least number engine arg ``name`` takes in this space (fixed or searched); None
        when no trial sets it (vLLM's default, e.g. the model's own ``max_model_len``)."""
        if isinstance(self.fixed.get(name), int):
            return int(self.fixed[name])
        for p in self.parameters:
            if p.name != name:
                continue
            if p.type == "int" and p.low is not None:
                return int(p.low)
            numbers = [c for c in p.choices if isinstance(c, int) and not isinstance(c, bool)]
            return min(numbers) if numbers else None
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record of the space, stored with the study."""
        return {
            "name": self.name,
            "fixed": self.fixed,
            "parameters": {
                p.name: {
                    k: v
                    for k, v in (
                        ("type", p.type),
                        ("low", p.low),
                        ("high", p.high),
                        ("log", p.log or None),
                        ("step", p.step),
                        ("choices", list(p.choices) or None),
                    )
                    if v is not None
                }
                for p in self.parameters
            },
            "constraints": [c.text() for c in self.constraints],
        }
