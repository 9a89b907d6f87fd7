#!/usr/bin/env bash
# run 168: the one-block attention kernels, when launched as a programmatic dependent (a decode
# step: p.dep_launch), also run the query transform and the codebook copies before grid_dep_wait,
# then issue their first code stages (plain launches keep the order of before: first stages, then
# transform and copies; the two-blocks kernels keep run 166's order). The step tests, run 166's
# step rows in three processes (with / without the dependent launch in each), the isolated i8
# rows new / base (the tree before run 164: .gpu-bundle/base.tar.xz) twice, then every CUDA test.
# A record: it ran once (2026-12-06, an H100) and the change was not committed (docs/cuda-notes.md,
# row 168). To run it again: `git apply docs/cuda-runs/run168-pdl-setup-first.patch`, put the tree
# before run 164's bench in .gpu-bundle/base.tar.xz, `bash scripts/gpu_bundle.sh`; there, with
# .gpu-bundle carried: `bash docs/cuda-runs/run168-pdl-setup-first.sh`.
set -uo pipefail
source scripts/gpu_prepare.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
base=/tmp/base
mkdir -p $base && vq_unpack .gpu-bundle/base.tar.xz $base
BB=$base/bench_decode_cuda
$T --gtest_filter='CudaDecode.*:CudaFP16Cache.*' --gtest_brief=1 > $OUT/run168-step-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|cuda decode pdl" $OUT/run168-step-tests.log | head -20
for r in 1 2 3; do
  $B --filter no-table-row --skip-encode > /tmp/steps.log 2>&1
  echo "== $r" >> $OUT/run168-steps.log; cat /tmp/steps.log >> $OUT/run168-steps.log
  grep -E "^decode step" /tmp/steps.log |
    sed -E 's/decode step \(graph: encode 1 token \+ attention, ([^,]*), ([^ ]*) codebooks.*\): ([0-9.]+) us overlapped.*\), ([0-9.]+) us serial.*without the dependent launch ([0-9.]+) us overlapped, ([0-9.]+) us serial.*/\1 \2: overlapped \3 (plain \5), serial \4 (plain \6)/' |
    sed "s/^/rep $r: /"
done
echo "steps: $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  for v in new base; do
    bin=$B; [[ $v == base ]] && bin=$BB
    $bin --filter +i8 --reps 20 --skip-encode --skip-step > /tmp/ab.log 2>&1
    echo "== $v $r" >> $OUT/run168-ab.log; cat /tmp/ab.log >> $OUT/run168-ab.log
    echo "$v $r: $(grep -E '^d4b(8|12)/d[48]b8\+i8 ' /tmp/ab.log | awk '{printf "%s %s %s | ", $1, $2, $7}') $(grep -c FAILED /tmp/ab.log) failed"
  done
done
echo "ab: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 2>&1 | tee $OUT/run168-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
