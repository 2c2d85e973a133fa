#!/bin/bash
# Issue 17, one run each side by side (benchmarks.compare, each config its own process): vLLM's
# defaults and the informed start's kv-fit-fp8-weights config as today's code derives it from the
# committed baselines' memory plans (tests/test_informed.py):
#   H200: fp8 weights + KV, the whole workload in one wave (1,000 seqs) at gpu_memory_utilization
#         0.97, CUDA graphs up to 1,024 (max_utilization(1024) = 0.979 there);
#   H100: fp8 weights + KV, 513 seqs (what its KV cache holds at 0.92), graphs up to 1,024.
# On the GPU machine (vLLM 0.26.0), after the chunk uploads (shared/gpu/README.md):
#   bash benchmarks/results/2026-12-06-one-wave/run.sh
set -u
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
bash .gpu/bin/install.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt
common='"kv_cache_dtype": "fp8", "quantization": "fp8", "async_scheduling": true, "max_cudagraph_capture_size": 1024'
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
*H200*) informed="{$common, \"max_num_seqs\": 1000, \"gpu_memory_utilization\": 0.97}" ;;
*) informed="{$common, \"max_num_seqs\": 513}" ;;
esac
date -u +"compare start %FT%TZ"
timeout ${SEC:-420} python3 -m benchmarks.compare --model-arch llama2-7b \
  --workload synthetic:count=1000,input_len=256,output_len=256 \
  --set load_format=dummy --set skip_tokenizer_init=true --set dtype=bfloat16 \
  --config 'defaults={}' --config "informed=$informed" --no-roofline --trial-timeout 300 \
  --out $OUT/cmp > $OUT/compare.log 2>&1
echo "compare rc=$?"; date -u +"compare end %FT%TZ"
cat $OUT/cmp/results.md 2>/dev/null | head -30
(cd $OUT/cmp && tar czf trials.tgz trials && rm -rf trials) 2>/dev/null
