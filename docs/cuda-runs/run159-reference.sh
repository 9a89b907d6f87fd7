#!/usr/bin/env bash
# run 159: the reference run of 3d1cc0f (run 157's kernels) on whatever the device tool lends
# (scripts/gpu_reference.sh, the same commands run 159 ran: the i8 table with the peer, batch 1
# twice more, every CUDA test). On the GPU machine, from the repository root, with .gpu-bundle
# carried: `bash docs/cuda-runs/run159-reference.sh` (any tree: the reference run of it).
bash scripts/gpu_reference.sh run159
