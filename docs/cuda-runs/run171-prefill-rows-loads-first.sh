#!/usr/bin/env bash
# run 171: run 170 with vq_materialize_kernel issuing every load of its four rows before using
# any (lengths, code words, the ring's row, λ), so a row costs two dependent round trips instead of
# four. The prefill tests, the prefill table with its fp16 peer, then every CUDA test.
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried: `bash docs/cuda-runs/run171-prefill-rows-loads-first.sh`.
bash scripts/gpu_prefill.sh run171
