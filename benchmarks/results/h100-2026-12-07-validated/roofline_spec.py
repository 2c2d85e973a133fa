"""The roofline table of README.md: benchmarks.roofline.floor_for on call 3's runs, with the H100
SXM5's spec-sheet rates (the call ran --no-roofline, so nothing was measured on the GPU).

    PYTHONPATH=. python benchmarks/results/h100-2026-12-07-validated/roofline_spec.py
"""

import json
import tempfile
from pathlib import Path

from benchmarks.models import DenseShape, write_arch
from benchmarks.roofline import Rates, floor_for

HERE = Path(__file__).parent
results = json.loads((HERE / "compare" / "results.json").read_text())
with tempfile.TemporaryDirectory() as tmp:
    shape = DenseShape.from_config(json.loads((write_arch("llama2-7b", tmp) / "config.json").read_text()))
rates = Rates({"bfloat16": 989.4e12}, 3.35e12)  # dense bf16 FLOP/s, HBM3 bytes/s (spec sheet)
print("| config | batch | decode steps | compute floor s | memory floor s | fraction | ceiling tok/s |")
for t in results["trials"]:
    if t.get("outcome") == "success":
        f = floor_for(shape, rates, t["metrics"], t["engine"])
        print(
            f"| {t['config']} | {f.batch} | {f.decode_steps:,} | {f.compute_s:.2f} | {f.memory_s:.2f} "
            f"| {f.fraction:.3f} | {f.ceiling_output_tokens_per_s:,.0f} |"
        )
