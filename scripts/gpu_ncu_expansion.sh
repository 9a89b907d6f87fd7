#!/usr/bin/env bash
# scripts/gpu_ncu_expansion.sh NAME BENCH [BENCH ARGS...] — on the GPU machine (after
# `source scripts/gpu_prepare.sh`, BENCH = its $B): ncu on the prefill expansion kernel alone
# (vq_materialize_kernel, the first 80 launches of `BENCH --prefill --reps 2`), the CSV in
# $OUT/NAME.csv and its condensed form (scripts/ncu_summary.py: one line per kernel and grid,
# gridDim.x = tokens / 4 at 8 kv heads) in $OUT/NAME-summary.txt, printed. BENCH ARGS go to the
# bench (e.g. an A/B switch); VQ_NCU_METRICS replaces the metric list.
# Runs 174-175.
set -uo pipefail
name=$1
prog=${2:?the bench program ($B after gpu_prepare.sh)}
shift 2
m=${VQ_NCU_METRICS:-gpu__time_duration.sum,dram__bytes_write.sum,dram__bytes_read.sum,l1tex__data_pipe_lsu_wavefronts.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum}
timeout 240 ncu --clock-control none --kernel-name regex:vq_materialize --launch-count 80 --metrics "$m" --csv \
  "$prog" --prefill --reps 2 "$@" > "$OUT/$name.csv" 2> "$OUT/$name.err" || echo "ncu rc $?"
python3 scripts/ncu_summary.py "$OUT/$name.csv" > "$OUT/$name-summary.txt"
cat "$OUT/$name-summary.txt"
