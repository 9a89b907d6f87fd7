#!/usr/bin/env bash
# Run 194 (twenty-second session, 2026-12-07): run 193's fused runtime with its own kernels (the
# norms, q/k/v post-processing, SwiGLU, the attention output's rounding) launched as programmatic
# dependents of the kernel before them (detail::set_runtime_pdl), and run 193's one failing test
# as mended (CudaDecode.BadStepInputsFailLaterAndLeaveTheCacheAsItWas: its prompt chunk ran
# between the capture key's reading and its check). From the repository root with .gpu-bundle's
# bins carried: `bash docs/cuda-runs/run194-runtime-pdl.sh run194` (~4 min on an H100): the
# runtime's CUDA tests and the mended one, then bench_runtime_decode with and without --no-pdl
# (the same binary), rounds alternating.
source scripts/gpu_run_start.sh "$1" --no-peer
R=$1
$T --gtest_brief=1 --gtest_filter='*CudaRuntime*:CudaDecode.BadStep*' > $OUT/$R-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|mixed" $OUT/$R-tests.log | head -20
echo "tests: $(( $(date +%s) - t0 )) s"
[[ -n $RD ]] || { echo "no bench_runtime_decode"; exit 1; }
for round in 1 2; do
  for p in "tiny --ctx 1024" "qwen0.5b --ctx 4096"; do
    n=${p%% *}
    for v in pdl plain; do
      f=""; [[ $v == plain ]] && f=--no-pdl
      $RD --preset $p --steps 128 --reps 3 $f > $OUT/$R-runtime-$n-$v-$round.log 2>&1
      echo "== $n, $v launches, round $round"; grep -E "^\| [fd]|FAILED" $OUT/$R-runtime-$n-$v-$round.log
    done
  done
  echo "round $round: $(( $(date +%s) - t0 )) s"
done
$RD --preset llama8b-2l --ctx 4096 --steps 128 --reps 3 > $OUT/$R-runtime-llama8b-2l.log 2>&1
echo "== llama8b-2l"; grep -E "^\||FAILED" $OUT/$R-runtime-llama8b-2l.log
echo "llama8b-2l: $(( $(date +%s) - t0 )) s"
