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
#: characters per stored piece: a study user attribute is a TEXT column, 64 KiB on MySQL
CHUNK = 50_000


@dataclass(frozen=True)
class StoredReference:
    """The probe of the baseline trial ``trial``."""

    trial: int
    probe: dict[str, Any]


def store_reference(study: optuna.Study, trial: int, probe: dict[str, Any]) -> None:
    """Store ``probe`` in pieces that fit any storage's column; the index goes last, so a
    reader never sees an index without its pieces."""
    # the decoded text is for people reading probe.json; comparisons need the tokens
    packed = pack(
        {**probe, "sequences": [{k: v for k, v in s.items() if k != "text"} for s in probe["sequences"]]}
    )
    pieces = [packed[i : i + CHUNK] for i in range(0, len(packed), CHUNK)]
    for i, piece in enumerate(pieces):
        study.set_user_attr(f"{REFERENCE_ATTR}_{trial}_{i}", piece)
    study.set_user_attr(REFERENCE_ATTR, {"trial": trial, "pieces": len(pieces)})


def stored_reference(study: optuna.Study) -> StoredReference | None:
    """The stored reference; None when none is (or it does not read back, said by the caller's
    fallback: the baseline's own file)."""
    attrs = study.user_attrs
    raw = attrs.get(REFERENCE_ATTR)
    if not isinstance(raw, dict):
        return None
    try:
        trial, pieces = int(raw["trial"]), int(raw["pieces"])
        return StoredReference(
            trial, unpack("".join(attrs[f"{REFERENCE_ATTR}_{trial}_{i}"] for i in range(pieces)))
        )
    except (KeyError, TypeError, ValueError):
        return None
