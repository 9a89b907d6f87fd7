#!/usr/bin/env bash
# run 162: the reference run of 4967603 (run 161's tree) on whatever the device tool lends:
# the i8 table (i8 and i8kv, d4b8 and the defaults; encode, bytes held) with the peer in the same
# command, the batch-1 rows twice more (the bars' edge cases), then every CUDA test. Here: nothing
# to prepare (the device builds from source); on the GPU machine, from the repository root, with
# .gpu-bundle carried: `bash docs/cuda-runs/run162-reference.sh`.
set -uo pipefail
source scripts/gpu_prepare.sh
[[ -n $T ]] || { echo "no test program"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
mkdir -p $OUT/b
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/run162-peer.log 2>&1 || echo "peer failed"
grep PEER $OUT/run162-peer.log
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 > $OUT/run162-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |encode keys d4b8 grid |held|FAILED" $OUT/run162-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  $B --peer $OUT/b/peer.txt --filter +i8 --quick --reps 30 --skip-encode --skip-step > $OUT/run162-batch1-$r.log 2>&1
  grep -E "^\| d4b(8|12)/d[48]b8\+i8(kv)? |FAILED" $OUT/run162-batch1-$r.log
done
echo "perf: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 2>&1 | tee $OUT/run162-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
