#!/usr/bin/env bash
# Run 183 (fourteenth session): the runtime's new device paths — CudaModel::forward with a KV
# observer, CudaModel::forward_nocache, perplexity and calibration samples through them, the
# command line's `perplexity --device cuda` and `calibrate --model --device cuda` — and the decode
# reference (scripts/gpu_reference.sh's i8 table with the peer, batch 1 twice more), then every
# CUDA test. From the repository root with .gpu-bundle carried:
#   bash docs/cuda-runs/run183-runtime-device-and-reference.sh run183
# Logs $OUT/RUN-{peer,table,batch1-1,batch1-2,cli,tests}.log.
source scripts/gpu_run_start.sh "$1"
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 > $OUT/$1-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |encode keys d4b8 grid |held|FAILED" $OUT/$1-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  $B --peer $OUT/b/peer.txt --filter +i8 --quick --reps 30 --skip-encode --skip-step > $OUT/$1-batch1-$r.log 2>&1
  grep -E "^\| d4b(8|12)/d[48]b8\+i8(kv)? |FAILED" $OUT/$1-batch1-$r.log
done
echo "perf: $(( $(date +%s) - t0 )) s"
if [[ -n ${E:-} ]]; then
  $E --gtest_filter='Cli.*' > $OUT/$1-cli.log 2>&1
  grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran" $OUT/$1-cli.log | head
else
  echo "no command-line tests (E unset)"
fi
$T --gtest_brief=1 2>&1 | tee $OUT/$1-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped|\[cuda forward\] .*(cache-less|perplexity|calibration)" | head -60
echo "total: $(( $(date +%s) - t0 )) s"
