#!/usr/bin/env bash
# run 169: prefill over dequantized rows (materialize_launch on vq_dequant_kernel then). A memory-bound cache's eager call of more than 16 queries
# writes its tokens once as exact rows into a pooled workspace (materialize_launch) and runs the
# prefill kernel over them, where the kernel over the codes dequantized every tile once per
# 128-row block. The new and changed prefill tests first, then the prefill table (every path,
# forced, and the default, against the fp16 peer measured in the same command), then every CUDA
# test (the tenth session's first GPU run: it also re-runs the step tests of 7c554d9's host mend).
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried: `bash docs/cuda-runs/run169-prefill-rows.sh`.
set -uo pipefail
source scripts/gpu_prepare.sh
[[ -n $T ]] || { echo "no test program"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
mkdir -p $OUT/b
$T --gtest_filter='CudaAttention.*Prefill*' --gtest_brief=1 > $OUT/run169-prefill-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|cuda prefill over rows" $OUT/run169-prefill-tests.log | head -20
echo "prefill tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --prefill --out $OUT/b/ppeer.txt > $OUT/run169-prefill-peer.log 2>&1 || echo "peer failed"
grep PREFILL $OUT/run169-prefill-peer.log
$B --prefill --peer $OUT/b/ppeer.txt --reps 20 > $OUT/run169-prefill-bench.log 2>&1
grep -E "^\||validation|^device" $OUT/run169-prefill-bench.log | cut -c1-400
echo "prefill bench: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 2>&1 | tee $OUT/run169-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
