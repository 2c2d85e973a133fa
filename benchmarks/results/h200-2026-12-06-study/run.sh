#!/bin/bash
# On the GPU machine (vLLM 0.26.0), after the chunk uploads (shared/gpu/README.md):
#   bash benchmarks/results/h200-2026-12-06-study/run.sh install
#   bash benchmarks/results/h200-2026-12-06-study/run.sh study SEC [autotune run args]      # the same command resumes
#   bash benchmarks/results/h200-2026-12-06-study/run.sh validate SEC [autotune validate args]
# On an H100 it resumes the validated 15-trial 7B study of ../h100-2026-12-06-validation towards
# 30 trials (RESUME=FILE names another copy); on an H200 it starts the same study afresh, or resumes
# RESUME=FILE (a study an earlier session ran: more trials towards 30 on a fresh machine).
# FRESH=1 starts a fresh study on either card (today's informed start from the first trial).
set -u
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
step=$1; shift
mkdir -p /tmp/st
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [ ! -f /tmp/st/s7b.db ] && [ -n "${FRESH:-}" ]; then
  touch /tmp/st/s7b.db && echo "$gpu: a fresh study (FRESH=1)"
elif [ ! -f /tmp/st/s7b.db ]; then
  case "$gpu" in
  *H100*) src=${RESUME:-benchmarks/results/h100-2026-12-06-validation/s7b.db}
          cp "$src" /tmp/st/s7b.db && echo "$gpu: study copied from $src" ;;
  *) if [ -n "${RESUME:-}" ]; then cp "$RESUME" /tmp/st/s7b.db && echo "$gpu: study copied from $RESUME"
     else echo "$gpu: a fresh study"; fi ;;
  esac
fi
save() {
  mkdir -p $OUT/st && cp /tmp/st/s7b.db $OUT/st/ && cp /tmp/st/forkserver-*.log $OUT/st/ 2>/dev/null
  (cd /tmp/st/s7b && tar czf $OUT/st/trials.tgz */*/result.json */*/spec.json */*/stderr.log */*/stdout.log 2>/dev/null)
  grep "\[autotune\]" $OUT/$1.log | cut -c1-300 | tail -45
}
case "$step" in
install)
  bash .gpu/bin/install.sh || exit 1
  [ -d /tmp/llama2-7b ] || python3 -c "from benchmarks.models import write_arch; write_arch('llama2-7b','/tmp/llama2-7b')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt
  ;;
validate)
  budget=$1; shift
  date -u +"validate start %FT%TZ"
  timeout $((budget + 120)) python3 -m autotune validate --study s7b --studies-dir /tmp/st \
    --top 2 --rounds 3 --trial-timeout 300 --time-budget $budget --no-bar "$@" >> $OUT/validate.log 2>&1
  echo "validate rc=$?"; date -u +"validate end %FT%TZ"
  save validate
  ;;
study)
  budget=$1; shift
  date -u +"study start %FT%TZ"
  timeout $((budget + 120)) python3 -m autotune run --model /tmp/llama2-7b \
    --workload synthetic:count=1000,input_len=256,output_len=256 --study s7b --studies-dir /tmp/st \
    --trials 30 --trial-timeout 300 --set load_format=dummy --set skip_tokenizer_init=true \
    --set dtype=bfloat16 --time-budget $budget --validate-rounds 0 --no-bar "$@" >> $OUT/study.log 2>&1
  echo "study rc=$?"; date -u +"study end %FT%TZ"
  save study
  ;;
esac
