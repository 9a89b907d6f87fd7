#!/usr/bin/env bash
# Run 189 (ran in the twentieth session as part of run 191, an H100; figures in docs/cuda-notes.md
# row 189, summaries docs/cuda-runs/run191-189-ncu-nr{1,4}-summary.txt): where the
# plain kernel of head_dim 80/96 spends its time after run 188 (replicated codebooks: 1.06-1.19x of
# cuDNN at GQA 4, 1.95-2.01x in Phi-3's shape, on an H100). ncu on one launch of each of two
# instantiations at 1x131072, d4b8 int8 keys, hd96: NR = 1 (Phi-3's shape, 32 kv heads: the real
# models at these dims, Phi-2 / Phi-3 / StableLM, have no GQA) and NR = 4 (8 kv heads). Per launch:
# duration; shared-memory load / store instructions and their wavefronts and bank conflicts (is it
# the instruction count, the conflicts, or neither?); the stall reasons per issued instruction
# (is a phase serialised: the softmax runs on NR warps of 8, one at NR = 1, while the others wait
# at the barrier?). From the repository root with .gpu-bundle carried:
#   bash docs/cuda-runs/run189-plain-profile.sh run189          (~2 min)
# Output: $OUT/RUN-ncu-{nr1,nr4}.csv and their summaries (scripts/ncu_summary.py).
source scripts/gpu_run_start.sh "$1" --no-peer
m=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum
m=$m,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum
m=$m,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
m=$m,smsp__inst_executed_pipe_lsu.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
m=$m,l1tex__throughput.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
s=regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio
for kv in 32 8; do
  nr=$([[ $kv == 32 ]] && echo 1 || echo 4)
  timeout 200 ncu --clock-control none --kernel-name regex:vq_attn_any_dim --launch-skip 2 --launch-count 1 \
    --metrics $m,$s --csv $B --plain --plain-kv $kv --plain-dim 96 --filter 'd4b8/d4b8+i8$' --quick --reps 2 \
    > $OUT/$1-ncu-nr$nr.csv 2> $OUT/$1-ncu-nr$nr.err || echo "ncu rc $? (nr $nr)"
  echo "== NR $nr ($kv kv heads)"
  python3 scripts/ncu_summary.py $OUT/$1-ncu-nr$nr.csv | tee $OUT/$1-ncu-nr$nr-summary.txt
done
echo "total: $(( $(date +%s) - t0 )) s"
