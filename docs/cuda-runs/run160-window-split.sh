#!/usr/bin/env bash
# run 160: the window split (AttnParams::window_split, attn_plan_window_split): at batch 1 the
# 16 coded splits of each kv head hold 8192 tokens each (whole rounds of every warp) and one more
# block per kv head attends the 128 window tokens on the SMs the coded blocks leave idle, instead
# of 16 splits of 8272 tokens whose last partial round keeps the other warps waiting. Same
# binary, default against --no-window-split (the weighted plan), two repetitions each, the peer
# in the same command; batch-1 profiles of both; then every CUDA test. Here: nothing to prepare
# (the device builds from source); on the GPU machine, from the repository root, with
# .gpu-bundle carried: `bash docs/cuda-runs/run160-window-split.sh`.
set -uo pipefail
source scripts/gpu_prepare.sh
[[ -n $T ]] || { echo "no test program"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
mkdir -p $OUT/b
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/run160-peer.log 2>&1 || echo "peer failed"
grep PEER $OUT/run160-peer.log
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 > $OUT/run160-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |encode keys d4b8 grid |held|FAILED" $OUT/run160-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  for ab in "" "--no-window-split"; do
    echo "== rep $r ${ab:-window split}"
    $B --peer $OUT/b/peer.txt --filter +i8 --quick --reps 30 --skip-encode --skip-step $ab > $OUT/run160-ab.log 2>&1
    grep -E "^\| d4b(8|12)/d[48]b8\+i8(kv)? |splits=|FAILED" $OUT/run160-ab.log
  done
done
for ab in "" "--no-window-split"; do
  for f in 'd4b8/d4b8+i8$' 'd4b12/d8b8+i8$'; do
    echo "== profile $f ${ab:-window split}"
    $B --filter "$f" --reps 10 --skip-encode --skip-step --profile --quick $ab 2>&1 | grep -E "profile|lifetime|setup|coded loop|window \(|wait for|combine|arrival|merge \(|slowest|last exit" | head -14
  done
done
echo "perf: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 2>&1 | tee $OUT/run160-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped|window split\]|window order\]|four-row kernel\]" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
