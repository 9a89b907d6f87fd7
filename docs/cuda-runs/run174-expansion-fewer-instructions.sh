#!/usr/bin/env bash
# run 174: run 173's tree with vq_materialize_kernel's lane stages of the key FWHT as one FFMA
# each (warp_fwht_row<E, true>: bit-identical) and one index division per four rows instead of
# one per row (ncu, run 173: the kernel issues ~220 warp instructions a row and is bound by
# issue, not by memory); the ring's rows read for every row again (run 173's skip of rows below
# n - R was wrong for shorter sequences of a ragged batch). The prefill tests, the prefill table
# with its fp16 peer, every CUDA test, then ncu on the expansion kernel alone.
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried:
# `bash docs/cuda-runs/run174-expansion-fewer-instructions.sh`.
bash scripts/gpu_prefill.sh run174
source scripts/gpu_prepare.sh > /dev/null 2>&1
bash scripts/gpu_ncu_expansion.sh run174-ncu "$B"  # (the ncu command the run wrote out here, a helper since)
