#!/usr/bin/env bash
# run 167: the reference run of the ninth session's final tree (runs 164-166: decode steps launch
# attention as a programmatic dependent) on whatever the device tool lends
# (scripts/gpu_reference.sh: the i8 table with the peer, the decode-step rows with and without the
# dependent launch, batch 1 twice more, every CUDA test). On the GPU machine, from the repository
# root, with .gpu-bundle carried: `bash docs/cuda-runs/run167-reference.sh`.
bash scripts/gpu_reference.sh run167
grep -E "^decode step" $OUT/run167-table.log | sed -E 's/; eager update.*//'
