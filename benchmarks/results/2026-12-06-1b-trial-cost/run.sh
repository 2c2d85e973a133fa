#!/bin/bash
# Issue 18 on the 1B: the same study with today's trial mechanics and with those of 2026-12-03,
# one machine, one call each. On the GPU machine (vLLM 0.26.0), after the chunk uploads
# (shared/gpu/README.md):
#   bash benchmarks/results/2026-12-06-1b-trial-cost/run.sh install
#   bash benchmarks/results/2026-12-06-1b-trial-cost/run.sh after SEC    # autotune run's trial defaults
#   bash benchmarks/results/2026-12-06-1b-trial-cost/run.sh before SEC   # + --cold-workers --no-early-stop
# Both run --no-informed-start, so TPE (seed 0) proposes the same configs in the same order and the
# two compare trial by trial. The install imports vLLM once, so neither pays the machine's cold
# disk; "after" runs first, so it pays the GPU's first engine start. Each study has its own vLLM
# cache (compile artifacts), so neither loads what the other compiled.
# Here, afterwards:
#   python -m benchmarks.trial_cost --study before=DIR/before/st/1b.db:before \
#     --study after=DIR/after/st/1b.db:after --out DIR
set -u
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
step=$1; shift
case "$step" in
install)
  bash .gpu/bin/install.sh || exit 1
  [ -d /tmp/llama3.2-1b ] || python3 -c "from benchmarks.models import write_arch; write_arch('llama3.2-1b','/tmp/llama3.2-1b')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt
  ;;
before|after)
  budget=$1; shift
  extra=(--no-informed-start); [ "$step" = before ] && extra+=(--cold-workers --no-early-stop)
  mkdir -p /tmp/st1/$step $OUT/$step/st
  date -u +"$step start %FT%TZ"
  timeout $((budget + 120)) python3 -m autotune run --model /tmp/llama3.2-1b \
    --workload synthetic:count=1000,input_len=256,output_len=256 --study $step --studies-dir /tmp/st1/$step \
    --trials 40 --trial-timeout 300 --set load_format=dummy --set skip_tokenizer_init=true \
    --set dtype=bfloat16 --time-budget $budget --validate-rounds 0 --no-bar \
    --vllm-cache /tmp/cache-$step "${extra[@]}" "$@" >> $OUT/$step/study.log 2>&1
  echo "$step rc=$?"; date -u +"$step end %FT%TZ"
  cp /tmp/st1/$step/*.db $OUT/$step/st/ 2>/dev/null; cp /tmp/st1/$step/forkserver-*.log $OUT/$step/st/ 2>/dev/null
  (cd /tmp/st1/$step/$step && tar czf $OUT/$step/st/trials.tgz */*/result.json */*/spec.json */*/stderr.log */*/stdout.log 2>/dev/null)
  grep "\[autotune\]" $OUT/$step/study.log | cut -c1-300 | tail -30
  ;;
esac
