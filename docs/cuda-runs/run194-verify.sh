#!/usr/bin/env bash
# Run 194 (twenty-second session, 2026-12-07): the final tree's runtime CUDA tests and run 193's
# one failing test as mended (CudaDecode.BadStepInputsFailLaterAndLeaveTheCacheAsItWas: its new
# prompt chunk ran between the capture key's reading and its check; now the key is checked first
# and no replay follows a chunk), then the runtime bench on the tiny preset. From the repository
# root with .gpu-bundle's bins carried: `bash docs/cuda-runs/run194-verify.sh run194` (~1 min).
# (docs/cuda-runs/run195-runtime-pdl-not-adopted.patch: the decoder's own kernels as programmatic
# dependents of the kernel before them, with `bench_runtime_decode --no-pdl` for its A/B and a
# bit-equality test; written this session, never run on a GPU: no machine could be started.)
source scripts/gpu_run_start.sh "$1" --no-peer
R=$1
$T --gtest_brief=1 --gtest_filter='*CudaRuntime*:CudaDecode.BadStep*' > $OUT/$R-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|mixed" $OUT/$R-tests.log | head -20
echo "tests: $(( $(date +%s) - t0 )) s"
[[ -n $RD ]] || exit 0
$RD --preset tiny --ctx 1024 --steps 128 --reps 3 > $OUT/$R-runtime-tiny.log 2>&1
grep -E "^\||FAILED" $OUT/$R-runtime-tiny.log
echo "tiny: $(( $(date +%s) - t0 )) s"
