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
bash scripts/gpu_step_ab.sh run168
