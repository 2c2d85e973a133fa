#!/bin/bash
# On the GPU machine (vLLM 0.26.0), after the chunk uploads (shared/gpu/README.md), with
# `carry: [".gpu/bin", ".gpu/p8", ".gpu/tok"]` on the install call (.gpu/tok: SmolLM2's tokenizer
# files, for the serve model's text):
#   bash benchmarks/results/h100-2026-12-06-serve/run.sh install
#   bash benchmarks/results/h100-2026-12-06-serve/run.sh serve SEC             # a serve-mode study of a 7B
#   STUDY=NAME bash .../run.sh serve SEC --trials 1 --workload ...            # another study (e.g. one cold trial)
#   bash benchmarks/results/h100-2026-12-06-serve/run.sh validate STUDY SEC    # its best vs the defaults, 2 rounds
#   bash benchmarks/results/h100-2026-12-06-serve/run.sh study SEC             # an offline 7B study (workload (a))
set -u
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
step=$1; shift
save() {  # $1: the study name and log
  mkdir -p $OUT/st && cp /tmp/st/$1.db $OUT/st/ && cp /tmp/st/forkserver-*.log $OUT/st/ 2>/dev/null
  (cd /tmp/st/$1 && tar czf $OUT/st/$1-trials.tgz */*/result.json */*/spec.json */*/stderr.log */*/stdout.log 2>/dev/null)
  grep "\[autotune\]" $OUT/$2.log | cut -c1-300 | tail -45
}
case "$step" in
install)
  bash .gpu/bin/install.sh || exit 1
  [ -d /tmp/llama2-7b ] || python3 -m benchmarks.models llama2-7b /tmp/llama2-7b
  [ -d /tmp/l7s ] || python3 -m benchmarks.models llama2-7b /tmp/l7s --tokenizer .gpu/tok
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
  ;;
study)
  budget=$1; shift
  date -u +"study start %FT%TZ"
  timeout $((budget + 90)) python3 -m autotune run --model /tmp/llama2-7b \
    --workload synthetic:count=1000,input_len=256,output_len=256 --study s7b --studies-dir /tmp/st \
    --trials 30 --trial-timeout 300 --set load_format=dummy --set skip_tokenizer_init=true \
    --set dtype=bfloat16 --no-quality-check --time-budget $budget --validate-rounds 0 --no-bar "$@" >> $OUT/study.log 2>&1
  echo "study rc=$?"; date -u +"study end %FT%TZ"
  save s7b study
  ;;
validate)
  study=$1 budget=$2; shift 2
  date -u +"validate start %FT%TZ"
  timeout $((budget + 90)) python3 -m autotune validate --study $study --studies-dir /tmp/st \
    --top 1 --rounds 2 --trial-timeout 300 --time-budget $budget --no-bar "$@" >> $OUT/validate.log 2>&1
  echo "validate rc=$?"; date -u +"validate end %FT%TZ"
  save $study validate
  ;;
serve)
  budget=$1; shift
  date -u +"serve start %FT%TZ"
  timeout $((budget + 90)) python3 -m autotune run --mode serve --model /tmp/l7s \
    --workload synthetic:count=768,input_len=256,output_len=256 --concurrency 128 \
    --slo ttft_p99_ms=1000,tpot_p99_ms=40 --study ${STUDY:-serve7b} --studies-dir /tmp/st \
    --trials 30 --trial-timeout 300 --set load_format=dummy --set dtype=bfloat16 \
    --no-quality-check --time-budget $budget --validate-rounds 0 --no-bar "$@" >> $OUT/serve.log 2>&1
  echo "serve rc=$?"; date -u +"serve end %FT%TZ"
  save ${STUDY:-serve7b} serve
  ;;
esac
