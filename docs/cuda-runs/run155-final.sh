#!/usr/bin/env bash
# run 155: the final tree of 2026-12-05's third session (613e94f's sources, the CUDA code of runs
# 152-153; run 154's I8F8 experiment reverted), on the H200: all CUDA tests, then the i8 table
# with the peer in the same command, then the batch-1 rows again (the bars' edge cases). Here: `bash scripts/gpu_bundle.sh`; on the GPU
# machine, from the repository root, with .gpu-bundle carried: `bash docs/cuda-runs/run155-final.sh`.
set -uo pipefail
source scripts/gpu_prepare.sh
[[ -n $T ]] || { echo "no test program"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
$T --gtest_brief=1 2>&1 | tee $OUT/run155-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "tests: $(( $(date +%s) - t0 )) s"
mkdir -p $OUT/b
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/run155-peer.log 2>&1 || echo "peer failed"
grep PEER $OUT/run155-peer.log
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 > $OUT/run155-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8 |encode keys d4b8 grid |held" $OUT/run155-table.log | head -30
$B --peer $OUT/b/peer.txt --filter +i8 --quick --reps 30 --skip-encode --skip-step > $OUT/run155-batch1.log 2>&1
grep -E "^\| d4b(8|12)/d[48]b8\+i8 " $OUT/run155-batch1.log
echo "total: $(( $(date +%s) - t0 )) s"
