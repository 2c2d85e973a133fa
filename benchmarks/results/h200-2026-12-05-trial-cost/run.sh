#!/bin/bash
# On the H200 (vLLM 0.26.0), after the chunk uploads (../../../../shared/gpu/README.md):
#   bash benchmarks/results/h200-2026-12-05-trial-cost/run.sh install   # once per machine
#   bash benchmarks/results/h200-2026-12-05-trial-cost/run.sh warm 420  # trials forked from a warm worker
#   bash benchmarks/results/h200-2026-12-05-trial-cost/run.sh cold 480  # --cold-workers: a fresh process per trial
# The same study twice (Llama-2-7B architecture, dummy weights, workload (a) 1000 x 256/256, the
# bundled throughput space, seed 0: the same configs in the same order), on one machine, the warm
# one FIRST: it pays the machine's cold compile and first-time kernel builds, the cold one finds
# them cached, so the speedup measured is a lower bound.
set -u
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
case "$1" in
install)
  bash .gpu/bin/install.sh || exit 1
  [ -d /tmp/llama2-7b ] || python3 -c "from benchmarks.models import write_arch; write_arch('llama2-7b','/tmp/llama2-7b')"
  python3 -m autotune.trial.worker --describe > /dev/null && echo "describe ok"
  ;;
warm|cold)
  name=$1 budget=$2
  extra=(); [ "$name" = cold ] && extra=(--cold-workers)
  date -u +"$name start %FT%TZ"
  timeout $((budget + 150)) python3 -m autotune run --model /tmp/llama2-7b \
    --workload synthetic:count=1000,input_len=256,output_len=256 --study $name --studies-dir /tmp/st \
    --trials 40 --trial-timeout 300 --set load_format=dummy --set skip_tokenizer_init=true \
    --set dtype=bfloat16 --time-budget $budget --validate-rounds 0 --no-bar "${extra[@]}" > $OUT/$name.log 2>&1
  echo "$name rc=$?"; date -u +"$name end %FT%TZ"
  mkdir -p $OUT/st && cp /tmp/st/$name.db $OUT/st/ && cp /tmp/st/forkserver-*.log $OUT/st/ 2>/dev/null
  (cd /tmp/st/$name && tar czf $OUT/st/$name-trials.tgz */result.json */spec.json */stdout.log */stderr.log)
  grep "\[autotune\]" $OUT/$name.log | cut -c1-260 | tail -40
  ;;
esac
