#!/usr/bin/env bash
# Run 195: prepared in the twenty-third session (no machine started then), run in the
# twenty-fourth (2026-12-07, an H100; logs docs/cuda-runs/run195-*): 43/43 tests passed, and the
# decoder's kernels as programmatic dependents bought nothing at the real shapes (within
# +0.4 / -1.3%), so the patch was not adopted (docs/runtime-cuda.md).
# What it checks: run 194's question (the mended CudaDecode.BadStepInputsFailLaterAndLeaveTheCacheAsItWas
# and the runtime's CUDA tests) on the tree with docs/cuda-runs/run195-runtime-pdl-not-adopted.patch
# applied, its new test CudaRuntime.DependentLaunchesChangeNothing included; then the runtime
# bench with the decoder's own kernels as programmatic dependents and plainly (--no-pdl),
# alternating, two rounds, in one binary (Qwen2.5-0.5B's shapes first).
# It needs the patch: `git apply docs/cuda-runs/run195-runtime-pdl-not-adopted.patch`, then
# `bash scripts/gpu_bundle.sh`, then from the repository root with .gpu-bundle's bins carried:
#   bash docs/cuda-runs/run195-pdl-and-verify.sh run195      (~3 min)
# Without the patch, use run194-verify.sh (the tests alone).
source scripts/gpu_run_start.sh "$1" --no-peer
R=$1
$T --gtest_brief=1 --gtest_filter='*CudaRuntime*:CudaDecode.BadStep*' > $OUT/$R-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|mixed" $OUT/$R-tests.log | head -20
echo "tests: $(( $(date +%s) - t0 )) s"
[[ -n $RD ]] || { echo "no bench_runtime_decode"; exit 1; }
for p in "qwen0.5b --ctx 4096" "tiny --ctx 1024" "llama8b-2l --ctx 4096"; do
  n=${p%% *}
  for rep in 1 2; do
    for mode in pdl plain; do
      flag=; [[ $mode == plain ]] && flag=--no-pdl
      $RD --preset $p --steps 128 --reps 3 $flag > $OUT/$R-runtime-$n-$mode-$rep.log 2>&1
      echo "== $n $mode (round $rep)"; grep -E "^\||FAILED" $OUT/$R-runtime-$n-$mode-$rep.log
    done
  done
  echo "runtime $n: $(( $(date +%s) - t0 )) s"
done
