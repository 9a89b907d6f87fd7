#!/usr/bin/env bash
# run 166: the attention kernel's grid_dep_wait moved from before the lengths' load to after the
# split arithmetic and the first L2 prefetches (within a decode step nothing before attention
# writes the lengths: only attention's last block advances them), so a dependent launch also
# overlaps the lengths' round trip with the step's kernel before it. The step tests, then run
# 165's step rows in three processes (with / without the dependent launch in each; compare the
# "plain" columns with run 165's for the machine), the isolated i8 rows new / base (the tree
# before run 164: .gpu-bundle/base.tar.xz) twice, then every CUDA test.
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried: `bash docs/cuda-runs/run166-pdl-wait-later.sh`.
bash scripts/gpu_step_ab.sh run166
