#!/usr/bin/env bash
# scripts/gpu_step_ab.sh RUN — a decode-step A/B on the GPU machine (from the repository root,
# .gpu-bundle carried, its base.tar.xz holding the bench of the tree to compare against): the
# decode-step tests, the bench's decode-step rows in three processes (each step with and without
# the dependent attention launch, one line per format: "overlapped X (plain Y), serial ..."), the
# isolated int8-key rows of this tree ("new") and the base twice, alternating, then every CUDA
# test. Logs $OUT/RUN-{step-tests,steps,ab,tests}.log. Runs 166 and 168 (docs/cuda-runs/).
set -uo pipefail
source scripts/gpu_prepare.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
base=/tmp/base
mkdir -p $base && vq_unpack .gpu-bundle/base.tar.xz $base
BB=$base/bench_decode_cuda
$T --gtest_filter='CudaDecode.*:CudaFP16Cache.*' --gtest_brief=1 > $OUT/$1-step-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|cuda decode pdl" $OUT/$1-step-tests.log | head -20
for r in 1 2 3; do
  $B --filter no-table-row --skip-encode > /tmp/steps.log 2>&1
  echo "== $r" >> $OUT/$1-steps.log; cat /tmp/steps.log >> $OUT/$1-steps.log
  grep -E "^decode step" /tmp/steps.log |
    sed -E 's/decode step \(graph: encode 1 token \+ attention, ([^,]*), ([^ ]*) codebooks.*\): ([0-9.]+) us overlapped.*\), ([0-9.]+) us serial.*without the dependent launch ([0-9.]+) us overlapped, ([0-9.]+) us serial.*/\1 \2: overlapped \3 (plain \5), serial \4 (plain \6)/' |
    sed "s/^/rep $r: /"
done
echo "steps: $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  for v in new base; do
    bin=$B; [[ $v == base ]] && bin=$BB
    $bin --filter +i8 --reps 20 --skip-encode --skip-step > /tmp/ab.log 2>&1
    echo "== $v $r" >> $OUT/$1-ab.log; cat /tmp/ab.log >> $OUT/$1-ab.log
    echo "$v $r: $(grep -E '^d4b(8|12)/d[48]b8\+i8 ' /tmp/ab.log | awk '{printf "%s %s %s | ", $1, $2, $7}') $(grep -c FAILED /tmp/ab.log) failed"
  done
done
echo "ab: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 2>&1 | tee $OUT/$1-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
