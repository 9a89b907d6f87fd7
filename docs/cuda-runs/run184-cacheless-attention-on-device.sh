#!/usr/bin/env bash
# Run 184: the cache-less pass's attention on the device (window_attention_kernel, replacing run
# 183's host attention_cpu), checked against the CPU pass on the committed checkpoints (head_dim
# 8-32, sliding window) and the hd64 ones, every runtime CUDA test and the command line's tests
# (the other CUDA sources are run 183's, whose 57 tests passed).
#   bash docs/cuda-runs/run184-cacheless-attention-on-device.sh run184
source scripts/gpu_run_start.sh "$1" --no-peer
$T --gtest_filter='*CudaRuntime*' > $OUT/$1-runtime.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|\[cuda forward\] .*(cache-less|perplexity|calibration)" $OUT/$1-runtime.log | head -40
if [[ -n ${E:-} ]]; then
  $E --gtest_filter='Cli.*' > $OUT/$1-cli.log 2>&1
  grep -E "^\[  (PASSED|FAILED) |FAILED" $OUT/$1-cli.log | head
fi
echo "total: $(( $(date +%s) - t0 )) s"
# Then, on the same warm machine (one more call), every CUDA test of the final tree:
#   source scripts/gpu_prepare.sh; $T --gtest_brief=1 > $OUT/run184-tests.log 2>&1
