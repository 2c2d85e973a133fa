#!/bin/bash
# Issue 17, parts 2 and 5, one call: vLLM's defaults, the informed start's two fp8 configs as
# today's code derives them from the committed baselines' memory plans (tests/test_informed.py),
# and the seed's hand-tuned config (../h200-2026-12-02), one run each side by side
# (benchmarks.compare: each config its own process, in this order):
#   H200: kv-fit-fp8-weights = fp8 weights + KV, the whole workload in one wave (1,000 seqs) at
#         gpu_memory_utilization 0.97, CUDA graphs up to 1,024 (max_utilization(1024) = 0.979);
#         kv-fit-fp8 = fp8 KV (bf16 weights), 914 seqs, graphs up to 1,024;
#   H100: kv-fit-fp8-weights = fp8 weights + KV, 513 seqs, graphs up to 1,024;
#         kv-fit-fp8 = fp8 KV, 468 seqs (within the default graphs).
# On the GPU machine (vLLM 0.26.0), after the chunk uploads (shared/gpu/README.md), ~8 min:
#   SEC=480 bash benchmarks/results/2026-12-06-one-wave/run.sh
# REPEAT=2 measures each config twice, interleaved (benchmarks.compare --repeat); SEED=0 leaves
# the seed out.
# The run writes its results after every config; one cut off by SEC leaves the others.
set -u
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
bash .gpu/bin/install.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt
fp8w='"kv_cache_dtype": "fp8", "quantization": "fp8", "async_scheduling": true, "max_cudagraph_capture_size": 1024'
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
*H200*) informed="{$fp8w, \"max_num_seqs\": 1000, \"gpu_memory_utilization\": 0.97}"
        kvfp8='{"kv_cache_dtype": "fp8", "async_scheduling": true, "max_num_seqs": 914, "max_cudagraph_capture_size": 1024}' ;;
*) informed="{$fp8w, \"max_num_seqs\": 513}"
   kvfp8='{"kv_cache_dtype": "fp8", "async_scheduling": true, "max_num_seqs": 468}' ;;
esac
seed='{"gpu_memory_utilization": 0.92, "block_size": 32, "max_num_batched_tokens": 8192, "max_num_seqs": 512, "enable_prefix_caching": true}'
seedcfg=(--config "seed=$seed"); [ "${SEED:-1}" = 0 ] && seedcfg=()
date -u +"compare start %FT%TZ"
timeout ${SEC:-480} python3 -m benchmarks.compare --model-arch llama2-7b \
  --workload synthetic:count=1000,input_len=256,output_len=256 \
  --set load_format=dummy --set skip_tokenizer_init=true --set dtype=bfloat16 \
  --config 'defaults={}' --config "kv-fit-fp8-weights=$informed" --config "kv-fit-fp8=$kvfp8" \
  "${seedcfg[@]}" --repeat ${REPEAT:-1} --no-roofline --trial-timeout 300 \
  --out $OUT/cmp > $OUT/compare.log 2>&1
echo "compare rc=$?"; date -u +"compare end %FT%TZ"
cat $OUT/cmp/results.md 2>/dev/null | head -30
(cd $OUT/cmp && tar czf trials.tgz trials && rm -rf trials) 2>/dev/null
