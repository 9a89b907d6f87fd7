#!/usr/bin/env bash
# run 170: run 169 with materialize_launch on its register kernel (vq_materialize_kernel: a warp a
# row, four rows in flight a warp, the FWHT by shuffles; run 169 used vq_dequant_kernel's
# shared-memory path). The prefill tests, the prefill table with its fp16 peer, then the decode
# reference (the i8 table with its peer, batch 1 once more: the bars, on whatever card
# came), then every CUDA test. Logs $OUT/run170-*.log.
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried: `bash docs/cuda-runs/run170-prefill-rows-registers.sh`.
bash scripts/gpu_prefill.sh run170 --decode
