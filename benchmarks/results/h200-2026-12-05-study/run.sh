#!/bin/bash
# On the H200 (vLLM 0.26.0), after the chunk uploads (shared/gpu/README.md):
#   bash benchmarks/results/h200-2026-12-05-study/run.sh install
#   bash benchmarks/results/h200-2026-12-05-study/run.sh study SEC [autotune run args]   # (re)run, SEC of time budget
# One study: Llama-2-7B architecture, dummy weights (the quality check is off: said so by the
# run), workload (a) 1000 x 256/256, the bundled throughput space (fp8 weights and KV cache,
# attention backend included), seed 0; trials forked from the warm worker (the default) and
# started by the configs the baseline informs (the default). The same command resumes it.
set -u
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
step=$1; shift
case "$step" in
install)
  bash .gpu/bin/install.sh || exit 1
  [ -d /tmp/llama2-7b ] || python3 -c "from benchmarks.models import write_arch; write_arch('llama2-7b','/tmp/llama2-7b')"
  ;;
study)
  budget=$1; shift
  # a fresh machine resumes the study from the last call's copy (a machine taken back mid-call)
  mkdir -p /tmp/st; [ -f /tmp/st/s7b.db ] || [ ! -f "${RESUME:-}" ] || { cp "$RESUME" /tmp/st/s7b.db; echo "resumed from $RESUME"; }
  date -u +"study start %FT%TZ"
  timeout $((budget + 120)) python3 -m autotune run --model /tmp/llama2-7b \
    --workload synthetic:count=1000,input_len=256,output_len=256 --study s7b --studies-dir /tmp/st \
    --trials 30 --trial-timeout 300 --set load_format=dummy --set skip_tokenizer_init=true \
    --set dtype=bfloat16 --time-budget $budget --validate-rounds 0 --no-bar "$@" >> $OUT/study.log 2>&1
  echo "study rc=$?"; date -u +"study end %FT%TZ"
  mkdir -p $OUT/st && cp /tmp/st/s7b.db $OUT/st/ && cp /tmp/st/forkserver-*.log $OUT/st/ 2>/dev/null
  (cd /tmp/st/s7b/trials && tar czf $OUT/st/trials.tgz */result.json */spec.json */stderr.log */stdout.log 2>/dev/null)
  grep "\[autotune\]" $OUT/study.log | cut -c1-300 | tail -45
  ;;
esac
