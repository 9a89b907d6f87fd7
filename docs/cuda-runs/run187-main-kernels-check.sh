#!/usr/bin/env bash
# Run 187 (nineteenth session): after run 186 (the two head_dim 80/96 patches, whose
# plain-kernel patch moved the main kernels' row loads onto the shared ldg_words / lds_entry
# helpers), the decode reference at head_dim 128 with the peer (scripts/gpu_reference.sh's i8
# table) and then every CUDA test, to confirm the main kernels' speed and results are unchanged.
# From the repository root with .gpu-bundle carried (both patches applied):
#   bash docs/cuda-runs/run187-main-kernels-check.sh run187
source scripts/gpu_run_start.sh "$1"
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 --skip-step > $OUT/$1-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |encode keys d4b8 grid |held|FAILED" $OUT/$1-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 > $OUT/$1-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" $OUT/$1-tests.log | head -40
echo "total: $(( $(date +%s) - t0 )) s"
