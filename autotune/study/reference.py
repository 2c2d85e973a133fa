"""The quality guard's reference, kept in the study: the baseline's probe (see
:mod:`autotune.trial.probe`), stored once the baseline completes, so that every worker of the
study, on any host, compares its trials with the same one, whether or not it can read the
baseline's trial directory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna

from autotune.trial.probe import pack, unpack

REFERENCE_ATTR = "autotune_reference_probe"


@dataclass(frozen=True)
class StoredReference:
    """The probe of the baseline trial ``trial``."""

    trial: int
    probe: dict[str, Any]


def store_reference(study: optuna.Study, trial: int, probe: dict[str, Any]) -> None:
    study.set_user_attr(REFERENCE_ATTR, {"trial": trial, "probe": pack(probe)})


def stored_reference(study: optuna.Study) -> StoredReference | None:
    """The stored reference; None when none is (or it does not read back, said by the caller's
    fallback: the baseline's own file)."""
    raw = study.user_attrs.get(REFERENCE_ATTR)
    if not isinstance(raw, dict) or not isinstance(raw.get("probe"), str):
        return None
    try:
        return StoredReference(int(raw["trial"]), unpack(raw["probe"]))
    except (KeyError, TypeError, ValueError):
        return None
