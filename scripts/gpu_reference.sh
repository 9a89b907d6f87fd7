#!/usr/bin/env bash
# scripts/gpu_reference.sh RUN — the reference run of the tree on the GPU machine (from the
# repository root, .gpu-bundle carried): the i8 table (i8 and i8kv, d4b8 and the defaults; encode,
# decode step, bytes held) with the peer in the same command, the batch-1 rows twice more (the
# bars' edge cases), then every CUDA test. Logs $OUT/RUN-{peer,table,batch1-1,batch1-2,tests}.log.
# Here: nothing to prepare (the device builds from source where the bundle's programs are stale).
source scripts/gpu_run_start.sh "$1"
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 > $OUT/$1-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |encode keys d4b8 grid |held|FAILED" $OUT/$1-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  $B --peer $OUT/b/peer.txt --filter +i8 --quick --reps 30 --skip-encode --skip-step > $OUT/$1-batch1-$r.log 2>&1
  grep -E "^\| d4b(8|12)/d[48]b8\+i8(kv)? |FAILED" $OUT/$1-batch1-$r.log
done
echo "perf: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 2>&1 | tee $OUT/$1-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
