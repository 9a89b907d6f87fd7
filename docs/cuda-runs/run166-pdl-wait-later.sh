#!/usr/bin/env bash
# run 166: the attention kernel's grid_dep_wait moved from before the lengths' load to after the
# split arithmetic and the first L2 prefetches (within a decode step nothing before attention
# writes the lengths: only attention's last block advances them), so a dependent launch also
# overlaps the lengths' round trip with the step's kernel before it. The step tests, then run
# 165's step rows in three processes (with / without the dependent launch in each; compare the
# "plain" columns with run 165's for the machine), the isolated i8 rows new / base (the tree
# before run 164: .gpu-bundle/base.tar.xz) twice, then every CUDA test.
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried: `bash docs/cuda-runs/run166-pdl-wait-later.sh`.
set -uo pipefail
source scripts/gpu_prepare.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
base=/tmp/base
mkdir -p $base && vq_unpack .gpu-bundle/base.tar.xz $base
BB=$base/bench_decode_cuda
$T --gtest_filter='CudaDecode.*:CudaFP16Cache.*' --gtest_brief=1 > $OUT/run166-step-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|cuda decode pdl" $OUT/run166-step-tests.log | head -20
for r in 1 2 3; do
  $B --filter no-table-row --skip-encode > /tmp/steps.log 2>&1
  echo "== $r" >> $OUT/run166-steps.log; cat /tmp/steps.log >> $OUT/run166-steps.log
  grep -E "^decode step" /tmp/steps.log |
    sed -E 's/decode step \(graph: encode 1 token \+ attention, ([^,]*), ([^ ]*) codebooks.*\): ([0-9.]+) us overlapped.*\), ([0-9.]+) us serial.*without the dependent launch ([0-9.]+) us overlapped, ([0-9.]+) us serial.*/\1 \2: overlapped \3 (plain \5), serial \4 (plain \6)/' |
    sed "s/^/rep $r: /"
done
echo "steps: $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  for v in new base; do
    bin=$B; [[ $v == base ]] && bin=$BB
    $bin --filter +i8 --reps 20 --skip-encode --skip-step > /tmp/ab.log 2>&1
    echo "== $v $r" >> $OUT/run166-ab.log; cat /tmp/ab.log >> $OUT/run166-ab.log
    echo "$v $r: $(grep -E '^d4b(8|12)/d[48]b8\+i8 ' /tmp/ab.log | awk '{printf "%s %s %s | ", $1, $2, $7}') $(grep -c FAILED /tmp/ab.log) failed"
  done
done
echo "ab: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 2>&1 | tee $OUT/run166-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
