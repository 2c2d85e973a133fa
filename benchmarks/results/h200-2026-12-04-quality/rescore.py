"""Re-score every trial's probe.json in results.tgz against trial 0's with the project's own
autotune.trial.probe.compare. From the repository root:

    python3 benchmarks/results/h200-2026-12-04-quality/rescore.py

Needed because trials 1, 3 and 4 of the first run were recorded as crashes (SIGABRT at engine
teardown, after the measurement and the probe had been written), so their result.json has no
quality.
"""

import json
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, ".")
from autotune.trial.probe import compare, read_probe

_FIXED = ("model", "max_model_len", "enforce_eager", "tensor_parallel_size")

here = Path(__file__).parent
with tempfile.TemporaryDirectory() as d:
    with tarfile.open(here / "results.tgz") as tar:
        tar.extractall(d)
    ref = read_probe(Path(d, "0", "probe.json"))
    for t in sorted((p for p in Path(d).iterdir() if p.is_dir()), key=lambda p: int(p.name)):
        kw = json.loads((t / "spec.json").read_text()).get("engine_kwargs", {})
        kw = {k: v for k, v in kw.items() if k not in _FIXED}
        tps = None
        for line in (t / "stdout.log").read_text().splitlines():
            if line.startswith("@@autotune ") and '"event": "result"' in line:
                tps = json.loads(line[11:])["metrics"]["output_tokens_per_s"]
        q = compare(ref, read_probe(t / "probe.json"), 0)
        print(
            f"#{t.name} {kw or '(defaults)'}: kl_mean {q.kl_mean:.6f} kl_max {q.kl_max:.4f} "
            f"top1 {q.top1:.4f} positions {q.positions} output tok/s {tps:.1f}"
        )
