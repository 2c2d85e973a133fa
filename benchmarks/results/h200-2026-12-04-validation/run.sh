# On the H200 (sourced in the repository root of the call): validate the committed 7B study of
# workload (a) with its top 3 configs and 3 rounds; `autotune validate` resumes across calls
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
HERE=benchmarks/results/h200-2026-12-04-validation
[ -d /tmp/llama2-7b ] || python3 -c "from benchmarks.models import write_arch; write_arch('llama2-7b','/tmp/llama2-7b')"
mkdir -p /tmp/st
[ -f /tmp/st/h200-llama2-7b.db ] || cp $HERE/h200-llama2-7b.db /tmp/st/
val() {  # val N BUDGET: one call's share of the rounds
  timeout $(( $2 + 60 )) python3 -m autotune validate --study h200-llama2-7b --studies-dir /tmp/st \
    --top 3 --rounds 3 --trial-timeout 300 --time-budget $2 --no-bar > $OUT/validate$1.log 2>&1
  echo "validate rc=$?"; cp /tmp/st/h200-llama2-7b.db $OUT/
  (cd /tmp/st && find . -name result.json | tar czf $OUT/results.tgz -T -)
  grep "\[autotune\]" $OUT/validate$1.log | cut -c1-300 | tail -30; tail -12 $OUT/validate$1.log
}
date -u +"start %FT%TZ"; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
