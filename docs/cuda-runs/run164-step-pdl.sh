#!/usr/bin/env bash
# run 164: decode steps launch attention as a programmatic dependent of the step's kernel before
# it (cudaLaunchAttributeProgrammaticStreamSerialization; the attention kernel's grid_dep_wait
# before its lengths' load, grid_dep_launch_dependents at the start of window_rows, the
# decode-mode encode and append_rows). "new" = the bundled programs (this tree), "base" = the
# committed tree 6f3fa82's bench (.gpu-bundle/base.tar.xz, same kernels as 8002774), to check
# that the isolated attention launches (no dependent launch: the bench times them alone) did not
# move with the added wait. Order: the step tests first (their outputs with and without the
# dependent launch must agree bit for bit), the new tree's i8 table with the decode-step rows
# (each step timed with and without the dependent launch in the same process), the isolated
# i8 rows new / base, every CUDA test, the i8 rows new / base again.
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried: `bash docs/cuda-runs/run164-step-pdl.sh`.
source scripts/gpu_run_start.sh run164
base=/tmp/base
mkdir -p $base && vq_unpack .gpu-bundle/base.tar.xz $base
BB=$base/bench_decode_cuda
$T --gtest_filter='CudaDecode.*:CudaFP16Cache.*' --gtest_brief=1 > $OUT/run164-step-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|cuda decode pdl" $OUT/run164-step-tests.log | head -20
echo "step tests: $(( $(date +%s) - t0 )) s"
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 > $OUT/run164-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |encode keys d4b8 grid |held|FAILED" $OUT/run164-table.log | head -30
grep -E "^decode step" $OUT/run164-table.log | sed -E 's/; eager update.*//'
echo "table: $(( $(date +%s) - t0 )) s"
ab() {  # $1: repetition
  for v in new base; do
    bin=$B; [[ $v == base ]] && bin=$BB
    $bin --peer $OUT/b/peer.txt --filter +i8 --reps 20 --skip-encode --skip-step > /tmp/ab.log 2>&1
    echo "== $v $1" >> $OUT/run164-ab.log; cat /tmp/ab.log >> $OUT/run164-ab.log
    echo "$v $1: $(grep -E '^\| d4b(8|12)/d[48]b8\+i8 ' /tmp/ab.log | awk -F'|' '{gsub(/ /, "", $2); gsub(/ /, "", $3); printf "%s@%s %s | ", $2, $3, $4}') $(grep -c FAILED /tmp/ab.log) failed"
  done
}
ab 1
echo "ab 1: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 2>&1 | tee $OUT/run164-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "tests: $(( $(date +%s) - t0 )) s"
ab 2
echo "total: $(( $(date +%s) - t0 )) s"
