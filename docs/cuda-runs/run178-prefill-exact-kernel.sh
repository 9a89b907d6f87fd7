#!/usr/bin/env bash
# run 178 (2026-12-06, twelfth session): the exact-rows prefill kernel (prefill_exact_kernel.cuh:
# 32 query rows a warp, 4 warps, two blocks a multiprocessor; every prefill launch over exact rows:
# the fp16 cache, Standard caches, prefill over dequantized rows) and run 177's patch (the
# expansion over head_dim / 16 lanes a row, cuda::set_materialize_lanes), both in one binary
# with their A/B switches: the prefill tests (the new ExactRows test runs both kernels in both
# tile sizes; the rows cases run both expansions), then the prefill table with the fp16 peer in
# the same command: --prefill-exact 1 (exact kernel, tiles of 64; warp-a-row expansion),
# --prefill-exact 0 (vq_prefill_kernel over exact rows, the default until this run),
# --materialize-lanes (coded caches only) and --prefill-exact 2 (tiles of 32, the fp16 cache only).
# PREPARED 2026-12-06 (twelfth session), NOT RUN: every device call of that session was refused
# (no machine could be started) until its device time was spent. Keep the kernel and make it the
# default (g_exact_mode in prefill.cu, the docs) if the tests pass and it is faster; likewise
# run 177's lanes expansion (cuda::set_materialize_lanes, on main since this session, off by default).
# Expected: vq_prefill_kernel's loop is bound by shared memory (2 wavefronts per MMA, 2.25 with
# the tile loads); 32 rows a warp brings it to 1.25 / 1 (S / PV) + 0.25: the fp16 cache's prefill
# 1.3-1.6x faster where the kernel dominates (0 x 4096), the rows path likewise minus its expansion.
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried: this script.
source scripts/gpu_run_start.sh run178 --no-peer
$T --gtest_filter='CudaAttention.*Prefill*:CudaDecode.Ragged*' --gtest_brief=1 > $OUT/run178-prefill-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|cuda prefill" $OUT/run178-prefill-tests.log | head -20
echo "prefill tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --prefill --out $OUT/b/ppeer.txt > $OUT/run178-prefill-peer.log 2>&1 || echo "peer failed"
grep PREFILL $OUT/run178-prefill-peer.log | head
echo "peer: $(( $(date +%s) - t0 )) s"
bench() {  # NAME [flags]
  local name=$1; shift
  timeout 200 $B --prefill --peer $OUT/b/ppeer.txt --reps 12 "$@" > $OUT/run178-prefill-bench-$name.log 2>&1 || echo "bench $name rc $?"
  echo "== $name ($*)"
  grep -E "^\| (d4b|fp16)|validation" $OUT/run178-prefill-bench-$name.log | awk -F'|' '{print $2"|"$3"|"$4"|"$6"|"$7"|"$10"|"$11"|"$14"|"$15"|"$16}'
  echo "t: $(( $(date +%s) - t0 )) s"
}
bench exact --prefill-exact 1
bench general --prefill-exact 0
bench lanes --materialize-lanes --filter d4b8/d4b8
bench tile32 --prefill-exact 2 --filter "fp16 cache"
# every other CUDA test, where the call's time allows (the limit is 600 s a call)
left=$(( ${DEADLINE:-540} - ($(date +%s) - t0) ))
if (( left > 150 )); then
  timeout $left $T --gtest_brief=1 --gtest_filter='-CudaAttention.*Prefill*:CudaDecode.Ragged*' > $OUT/run178-tests.log 2>&1 || echo "tests rc $?"
  grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" $OUT/run178-tests.log | head -20
else
  echo "no time left for the other CUDA tests ($left s)"
fi
echo "total: $(( $(date +%s) - t0 )) s"
