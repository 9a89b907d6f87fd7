#!/usr/bin/env bash
# run 173: vq_materialize_kernel gathers a lane's centroid elements and λ in 16-byte loads
# (ldg_floats) instead of one float each; Stash caches whose held rows agree with the decode
# kernel's centroids attend over them (no workspace, no expansion). The prefill tests, the
# prefill table with its fp16 peer, the decode reference (i8 table with its peer), every CUDA
# test, then ncu on the expansion kernel alone (duration, bytes, L1 wavefronts per launch,
# grouped by grid: gridDim.x = tokens / 4 at 8 kv heads). (As run, the ncu part ran first, on
# the same binaries; its summary was made here from the CSV.) The tests found run 173's skip of
# the ring's rows below n - R wrong for a ragged batch's shorter sequences: fixed in run 174.
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried:
# `bash docs/cuda-runs/run173-expansion-vector-loads.sh`.
bash scripts/gpu_prefill.sh run173 --decode
source scripts/gpu_prepare.sh > /dev/null 2>&1
m=gpu__time_duration.sum,dram__bytes_write.sum,dram__bytes_read.sum,l1tex__data_pipe_lsu_wavefronts.sum
m=$m,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
timeout 300 ncu --clock-control none --kernel-name regex:vq_materialize --launch-count 120 --metrics $m --csv \
  $B --prefill --reps 2 > $OUT/run173-ncu.csv 2> $OUT/run173-ncu.err || echo "ncu rc $?"
python3 scripts/ncu_summary.py $OUT/run173-ncu.csv | tee $OUT/run173-ncu-summary.txt
