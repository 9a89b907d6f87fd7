#!/usr/bin/env bash
# run 177 (PREPARED 2026-12-06, eleventh session; NOT RUN: the session's device time was spent):
# the prefill expansion over head_dim / 16 lanes a row (vq_materialize_lanes_kernel, 16
# consecutive elements a lane, 32 / LPR rows a warp instruction, two passes in flight; 113-119
# registers, two blocks of 256 a multiprocessor, no spill at sm_90) against the warp-a-row
# kernel, both in one binary (cuda::set_materialize_lanes, bench flag --materialize-lanes): the
# prefill tests (the rows-forced cases with both kernels, the ragged batch with both), ncu of
# the expansion alone with each kernel (the lanes kernel's gridDim.x = tokens / 8 at head_dim
# 128, the other's tokens / 4), the prefill table with each, then every CUDA test.
# Expected (run 175's SASS: ~180 warp instructions a row, ~100 of them per-row bookkeeping that
# the lanes kernel shares between 4 rows): ~90-100 a row, the expansion ~130 -> ~60-70 us at
# 34000 tokens if it stays bound by issue.
# The patch (run177-materialize-lanes.patch, removed) is on main since 2026-12-06's twelfth session,
# the lanes kernel off by default; run 178's script (run178-prefill-exact-kernel.sh) times both
# expansions too. Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried: this script.
# Make the lanes kernel the default if the tests pass and it is faster.
source scripts/gpu_run_start.sh run177 --no-peer
$T --gtest_filter='CudaAttention.*Prefill*:CudaDecode.Ragged*' --gtest_brief=1 > $OUT/run177-prefill-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|cuda prefill over rows" $OUT/run177-prefill-tests.log | head -20
bash scripts/gpu_ncu_expansion.sh run177-ncu-warp "$B"
bash scripts/gpu_ncu_expansion.sh run177-ncu-lanes "$B" --materialize-lanes
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --prefill --out $OUT/b/ppeer.txt > $OUT/run177-prefill-peer.log 2>&1 || echo "peer failed"
for which in warp lanes; do
  flag=; [[ $which == lanes ]] && flag=--materialize-lanes
  $B --prefill --peer $OUT/b/ppeer.txt --reps 20 $flag > $OUT/run177-prefill-bench-$which.log 2>&1
  echo "== $which"; grep -E "^\| (d4b|fp16)|validation" $OUT/run177-prefill-bench-$which.log | awk -F'|' '{print $2"|"$3"|"$4"|"$7"|"$11"|"$14"|"$16}'
done
$T --gtest_brief=1 2>&1 | tee $OUT/run177-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran" | head -20
echo "total: $(( $(date +%s) - t0 )) s"
