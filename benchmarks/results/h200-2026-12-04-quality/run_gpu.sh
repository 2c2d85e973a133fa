#!/bin/bash
# On the H200 machine, after the chunk uploads: reassemble the model, run the study, dump each trial's quality.
R=benchmarks/results/h200-2026-12-04-quality
cat /tmp/mchunks/m?? | gzip -dc | tar xf - -C /tmp && ls -la /tmp/model
bash .gpu/bin/install.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
python3 -m autotune run --model /tmp/model --space throughput --study q --studies-dir /tmp/st \
  --trials 7 --workload $R/prompts.jsonl \
  --set max_model_len=2048 --set enforce_eager=true \
  --enqueue '{"kv_cache_dtype":"fp8"}' --enqueue '{"quantization":"fp8"}' \
  --enqueue '{"quantization":"fp8","kv_cache_dtype":"fp8"}' --enqueue '{"max_num_seqs":32}' \
  --enqueue '{"kv_cache_dtype":"fp8_e5m2"}' --enqueue '{"dtype":"float16"}' \
  --quality-budget 10 --validate-rounds 0 --trial-timeout 300 --no-bar > $OUT/run.log 2>&1
echo "autotune rc=$?"
grep '^\[autotune\]\|^study\|Error' $OUT/run.log | head -60
python3 - <<'PY'
import json, glob, os
for p in sorted(glob.glob('/tmp/st/q/trials/*/result.json'), key=lambda s: int(s.split('/')[-2])):
    n = p.split('/')[-2]
    r = json.load(open(p))
    kw = {k: v for k, v in (r.get('engine_kwargs') or {}).items() if k != 'model'}
    q = r.get('quality') or {}
    qd = {k: q.get(k) for k in ('kl_mean', 'kl_max', 'top1', 'positions')} if isinstance(q, dict) else q
    print(n, kw, 'outcome=', r.get('outcome'), 'err=', str(r.get('error'))[:200])
    print('   quality', qd, '| metrics', {k: v for k, v in (r.get('metrics') or {}).items() if 'per_s' in k or 'elapsed' in k})
PY
cd /tmp/st/q/trials && tar czf $OUT/results.tgz */result.json 0/probe.json */spec.json 2>/dev/null; ls -la $OUT
for f in /tmp/st/q/trials/*/stderr.log; do if grep -q 'Traceback\|Error' $f; then echo "== $f"; grep -B2 -A3 'Error' $f | tail -15; fi; done
