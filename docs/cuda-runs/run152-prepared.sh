#!/usr/bin/env bash
# run 152 (run on an H100 on 2026-12-05: docs/cuda-notes.md): the tree after the CUDA caches' shared eager
# attention; all CUDA tests, the i8 table with the peer, the split planner's window weight swept
# at batch 1 and 8, a batch-1 profile of the defaults. Here: `git apply
# docs/cuda-runs/run152-cuda-caches-shared-eager-attention.patch && bash scripts/gpu_bundle.sh`;
# on the GPU machine, from the repository root, with .gpu-bundle carried:
# `bash docs/cuda-runs/run152-prepared.sh` (logs under $OUT).
set -uo pipefail
source scripts/gpu_prepare.sh
[[ -n $T ]] || { echo "no test program"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
$T --gtest_brief=1 2>&1 | tee $OUT/run152-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "tests: $(( $(date +%s) - t0 )) s"
mkdir -p $OUT/b
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/run152-peer.log 2>&1 || echo "peer failed"
tail -4 $OUT/run152-peer.log
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 > $OUT/run152-table.log 2>&1
grep -E "HBM copy|\+i8 |x  *[0-9]|ratio|encode|held|step" $OUT/run152-table.log | head -60
echo "table: $(( $(date +%s) - t0 )) s"
for cfg in 'd4b8/d4b8+i8$' 'd4b12/d8b8+i8$'; do
  for sh in 1x131072 8x32768; do
    for w in 1 2 4 7 10 16; do
      r=$($B --filter "$cfg" --shape $sh --window-weight $w --reps 20 --skip-encode --skip-step 2>&1 | grep -E "^d4" | head -1)
      echo "w=$w $r"
    done
  done
done 2>&1 | tee $OUT/run152-window-weight.log | sed -E 's/ +/ /g' | cut -c1-150
echo "sweep: $(( $(date +%s) - t0 )) s"
$B --filter 'd4b12/d8b8+i8$' --shape 1x131072 --reps 20 --skip-encode --skip-step --profile > $OUT/run152-profile-defaults-b1.log 2>&1
grep -E "profile|median|setup|loop|merge" $OUT/run152-profile-defaults-b1.log | head -20
echo "total: $(( $(date +%s) - t0 )) s"
