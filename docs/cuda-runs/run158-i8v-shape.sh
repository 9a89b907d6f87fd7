#!/usr/bin/env bash
# run 158: run 157's int8-value four-row kernel (I8KV) in the 8-warp, 4-k-tile shape (64-token
# warp tiles: one s32 -> f32 flush per 64 tokens instead of 32; 167 registers, no spill) instead
# of 16 warps x 2 k-tiles: the d4b8 rows (i8 and i8kv) twice with the peer in the same command,
# batch-1 profiles, then the attention and decode tests. To rerun: in src/cuda/attn_k4b8_v4b8.cu
# register the CBF 3 four-row kernels as attn_entry<D, 4, 8, 4, 8, 1, 4, 1, 8, 3, 3, 1>; on the GPU
# machine, from the repository root, with .gpu-bundle carried: `bash docs/cuda-runs/run158-i8v-shape.sh`.
set -uo pipefail
source scripts/gpu_prepare.sh
[[ -n $T ]] || { echo "no test program"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
mkdir -p $OUT/b
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/run158-peer.log 2>&1 || echo "peer failed"
grep PEER $OUT/run158-peer.log
for rep in 1 2; do
  $B --peer $OUT/b/peer.txt --filter d4b8/d4b8+i8 --reps 20 --skip-encode --skip-step > $OUT/run158-table$rep.log 2>&1
  grep -E "^device|HBM copy|^\| d4b8/d4b8\+i8|FAILED" $OUT/run158-table$rep.log
done
for f in 'd4b8/d4b8+i8$' 'd4b8/d4b8+i8kv$'; do
  $B --filter "$f" --reps 10 --skip-encode --skip-step --profile --quick > $OUT/run158-profile-$(echo $f | tr -d '/$+').log 2>&1
done
grep -hE "^d4b8|coded loop|combine" $OUT/run158-profile-*.log | head -20
echo "perf: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 --gtest_filter='CudaAttention.*:CudaDecode.*' 2>&1 | tee $OUT/run158-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|four-row kernel\]|two-blocks kernels\]|cuda attention i8kv" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
