"""Merge the results of several ``benchmarks.compare`` runs into one report.

    python -m benchmarks.merge RUN_DIR [RUN_DIR ...] --out DIR

For when one machine session cannot hold every config (a device call of limited length): run
``compare`` a few times on the same model, workload and ``--set`` args, then merge. A config name
seen in several runs with the same engine args counts as more runs of it; with different args it
is an error. Runs measured under different settings are refused unless ``--force``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from benchmarks import report

#: what two runs must share for their numbers to be comparable
_SAME = ("workload", "fixed", "sampling", "warmup_requests", "device")


def merge(docs: list[dict[str, Any]], *, force: bool = False) -> dict[str, Any]:
    """One comparison document holding the configs and trials of ``docs`` (the first's header)."""
    first = docs[0]
    problems = []
    for doc in docs[1:]:
        problems += [
            f"{key}: {first.get(key)!r} vs {doc.get(key)!r}"
            for key in _SAME
            if doc.get(key) != first.get(key)
        ]
        if doc["model"].get("shape") != first["model"].get("shape"):
            problems.append(f"model: {first['model']['arch']} vs {doc['model']['arch']}")
    if problems and not force:
        raise ValueError(
            "the runs measured different things (pass --force to merge anyway): " + "; ".join(problems)
        )
    merged = {**first, "configs": [], "trials": [], "summary": []}
    seen: dict[str, dict[str, Any]] = {}
    for doc in docs:
        for c in doc["configs"]:
            if c["name"] in seen:
                if seen[c["name"]]["engine_kwargs"] != c["engine_kwargs"]:
                    raise ValueError(f"config {c['name']!r} has different engine args in two runs")
                continue
            seen[c["name"]] = c
            merged["configs"].append(c)
        merged["trials"] += doc["trials"]
    merged["merged_from"] = [
        {k: d.get(k) for k in ("command", "started_at", "finished_at", "status")} for d in docs
    ]
    merged["command"] = " ; ".join(d["command"] for d in docs)
    merged["started_at"] = min(d["started_at"] for d in docs)
    finished = [d.get("finished_at") for d in docs]
    merged["finished_at"] = max(f for f in finished if f) if any(finished) else None
    statuses = {d.get("status") for d in docs}
    merged["status"] = (
        "complete" if statuses == {"complete"} else "merged: " + ", ".join(sorted(map(str, statuses)))
    )
    merged["repeat"] = max(
        (sum(1 for t in merged["trials"] if t["config"] == c["name"]) for c in merged["configs"]), default=0
    )
    return merged


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.merge", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="--out directories of compare runs")
    p.add_argument("--out", required=True, type=Path, help="directory for the merged results.json/.md")
    p.add_argument("--force", action="store_true", help="merge runs with different settings")
    args = p.parse_args(argv)
    try:
        docs = [json.loads((d / "results.json").read_text(encoding="utf-8")) for d in args.runs]
        doc = merge(docs, force=args.force)
    except (OSError, ValueError, KeyError) as e:
        print(f"merge: error: {e}", file=sys.stderr)
        return 2
    doc["merge_command"] = shlex.join(["python", "-m", "benchmarks.merge", *argv])
    args.out.mkdir(parents=True, exist_ok=True)
    report.write(doc, args.out)
    print(report.render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
