#!/usr/bin/env bash
# run 169: prefill over dequantized rows (materialize_launch on vq_dequant_kernel then). A memory-bound cache's eager call of more than 16 queries
# writes its tokens once as exact rows into a pooled workspace (materialize_launch) and runs the
# prefill kernel over them, where the kernel over the codes dequantized every tile once per
# 128-row block. The new and changed prefill tests first, then the prefill table (every path,
# forced, and the default, against the fp16 peer measured in the same command), then every CUDA
# test (the tenth session's first GPU run: it also re-runs the step tests of 7c554d9's host mend).
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried: `bash docs/cuda-runs/run169-prefill-rows.sh`.
bash scripts/gpu_prefill.sh run169
