#!/usr/bin/env bash
# run 154, first command: build on the GPU machine (the bundled programs predate I8F8), the new
# format's test first, then every CUDA test. The table follows in run154-f8v.sh (same machine).
# The I8F8 code is not on main (slower than i8 on sm_90: docs/cuda-notes.md, run 154); to rerun,
# apply docs/cuda-runs/run154-i8f8.patch to 613e94f first (git apply).
set -uo pipefail
source scripts/gpu_prepare.sh
[[ -n $T ]] || { echo "no test program"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
$T --gtest_filter='CudaAttention.Int8KeysAndFp8Values*' 2>&1 | tee $OUT/run154-f8-test.log | grep -E "OK|FAILED|Failure|cuda attention|Expected|Which is|nmse|NMSE|case" | head -40
echo "f8 test: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 --gtest_filter='-CudaAttention.Int8KeysAndFp8Values*' 2>&1 | tee $OUT/run154-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran" | head -30
echo "tests: $(( $(date +%s) - t0 )) s"
