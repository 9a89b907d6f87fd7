#!/usr/bin/env bash
# run 165: run 164's decode-step rows again, three processes in a row (the step section only: no
# table row matches the filter, no encode table), each step captured and timed with and without
# attention as a programmatic dependent launch (40 replays after an L2 flush, median), to see
# which of run 164's single differences outlast the noise.
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried: `bash docs/cuda-runs/run165-step-pdl-repeats.sh`.
set -uo pipefail
source scripts/gpu_prepare.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
for r in 1 2 3; do
  $B --filter no-table-row --skip-encode > $OUT/run165-steps-$r.log 2>&1
  grep -E "^decode step" $OUT/run165-steps-$r.log |
    sed -E 's/decode step \(graph: encode 1 token \+ attention, ([^,]*), ([^ ]*) codebooks.*\): ([0-9.]+) us overlapped.*\), ([0-9.]+) us serial.*without the dependent launch ([0-9.]+) us overlapped, ([0-9.]+) us serial.*/\1 \2: overlapped \3 (plain \5), serial \4 (plain \6)/' |
    sed "s/^/rep $r: /"
done
