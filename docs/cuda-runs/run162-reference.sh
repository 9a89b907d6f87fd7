#!/usr/bin/env bash
# run 162: the reference run of 4967603 (run 161's tree) on whatever the device tool lends
# (scripts/gpu_reference.sh: the i8 table with the peer, batch 1 twice more, every CUDA test).
# On the GPU machine, from the repository root, with .gpu-bundle carried:
# `bash docs/cuda-runs/run162-reference.sh`. Ran once, 2026-12-06, on an H100 (notes row 162).
bash scripts/gpu_reference.sh run162
