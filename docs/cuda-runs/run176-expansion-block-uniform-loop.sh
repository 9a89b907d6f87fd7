#!/usr/bin/env bash
# run 176: vq_materialize_kernel's loop over the block's groups of rows (a trip count the
# compiler can see is the block's) instead of a per-warp grid-stride bound, so the key FWHT's
# shuffles need no WARPSYNC / ENDCOLLECTIVE fix-ups. Against run 175's binaries in the same
# command (base-bins.tar.xz, carried in .gpu-bundle): the SASS opcode counts of
# vq_materialize_kernel<128, 4> and ncu of the expansion kernel alone (duration, instructions,
# bytes) for both, then the prefill tests, the prefill table with its fp16 peer and every CUDA
# test on the new tree.
# Here: cp .gpu-bundle/bins.tar.xz aside before `bash scripts/gpu_bundle.sh`, then put it back as
# .gpu-bundle/base-bins.tar.xz; there: `bash docs/cuda-runs/run176-expansion-block-uniform-loop.sh`.
source scripts/gpu_prepare.sh > /dev/null 2>&1
vq_unpack .gpu-bundle/base-bins.tar.xz .gpu-bundle/base
BASE=.gpu-bundle/base/bench/bench_decode_cuda
sass_counts() {
  cuobjdump -sass "$1" | awk '/Function : .*vq_materialize_kernelILi128ELi4E/{f=1} f&&/Function : /&&!/vq_materialize_kernelILi128ELi4E/{f=0} f' |
    grep -oE '^\s+/\*[0-9a-f]+\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_.]+' | awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -16 | tr '\n' ' '
  echo
}
echo "SASS new:  $(sass_counts $B)"
echo "SASS base: $(sass_counts $BASE)"
m=gpu__time_duration.sum,dram__bytes_write.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active
for which in new base; do
  prog=$B; [[ $which == base* ]] && prog=$BASE
  timeout 120 ncu --clock-control none --kernel-name regex:vq_materialize --launch-count 70 --metrics $m --csv \
    $prog --prefill --reps 2 > $OUT/run176-ncu-$which.csv 2>/dev/null || echo "ncu $which rc $?"
  echo "== $which"; python3 scripts/ncu_summary.py $OUT/run176-ncu-$which.csv | grep -E "^kernel|8704|8320"
done
bash scripts/gpu_prefill.sh run176
