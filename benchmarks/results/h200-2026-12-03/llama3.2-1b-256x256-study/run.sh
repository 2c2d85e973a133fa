# sourced from studies/h200/src on the device (code: git archive of d5fa712)
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
[ -d /tmp/llama3.2-1b ] || python3 -c "from benchmarks.models import write_arch; write_arch('llama3.2-1b','/tmp/llama3.2-1b')"
mkdir -p /tmp/st /tmp/cmp
WLA=synthetic:count=1000,input_len=256,output_len=256
STUDY=h200-llama3.2-1b
FIX="--set load_format=dummy --set skip_tokenizer_init=true --set dtype=bfloat16"
SEED='{"gpu_memory_utilization":0.92,"block_size":32,"max_num_batched_tokens":8192,"max_num_seqs":512,"enable_prefix_caching":true}'
A18='{"gpu_memory_utilization":0.85,"kv_cache_dtype":"fp8","block_size":64,"enable_prefix_caching":false,"max_num_seqs":428,"max_num_batched_tokens":20196,"long_prefill_token_threshold":512,"enforce_eager":false,"max_cudagraph_capture_size":1024,"async_scheduling":true}'
echo "$SEED" > /tmp/seed.json; echo "$A18" > /tmp/a18.json
[ -f /tmp/st/$STUDY.db ] || [ ! -f ../$STUDY.db ] || { cp ../$STUDY.db /tmp/st/; echo "restored $STUDY.db from carry"; }
save() { mkdir -p $OUT/st; cp /tmp/st/*.db $OUT/st/ 2>/dev/null; (cd /tmp/st && find . -name result.json | tar czf $OUT/st/results.tgz -T -); }
runcmp() { local n=$1; shift; timeout ${CT:-330} python3 -m benchmarks.compare --model-arch ${ARCH:-llama3.2-1b} $FIX --trial-timeout 200 "$@" --out /tmp/cmp/$n > $OUT/$n.log 2>&1; echo "compare $n rc=$?"; mkdir -p $OUT/$n; cp /tmp/cmp/$n/results.* $OUT/$n/ 2>/dev/null; (cd /tmp/cmp/$n 2>/dev/null && tar czf $OUT/$n/trials.tgz trials); cat $OUT/$n/results.md 2>/dev/null | head -40 | cut -c1-400; }
study() { timeout $(( $1 + 120 )) python3 -m autotune run --model /tmp/llama3.2-1b --workload $WLA --study $STUDY --studies-dir /tmp/st --trials ${TRIALS:-40} --trial-timeout ${TT:-200} $FIX --enqueue /tmp/seed.json --enqueue /tmp/a18.json --time-budget $1 --no-bar > $OUT/study$2.log 2>&1; echo "study rc=$?"; save; grep "\[autotune\]" $OUT/study$2.log | cut -c1-300 | tail -60; }
date -u +"start %FT%TZ"
