#!/usr/bin/env bash
# run 180 (2026-12-06, thirteenth session): on top of run 179 (the exact-rows kernel 3-15% faster
# than vq_prefill_kernel on grids of two blocks a multiprocessor or more, 14-20% slower on grids
# of one), the rule that routes launches (cuda::kExactAuto, prefill_exact_pays: >= 1.5 x SMs
# blocks), the history split for smaller grids (2-4 blocks a row block, then a merge kernel:
# prefill_exact_split_plan; tiles of 32 at head_dim 128) and run 177's lanes expansion as the
# default. The prefill tests (the new routing test, the split against the oracle and the unsplit
# kernel), then the prefill table with the fp16 peer in the same command: the defaults (auto),
# vq_prefill_kernel (--prefill-exact 0), the unsplit exact kernel everywhere (--prefill-exact 1
# --prefill-splits 1), the split forced over 2 everywhere, tiles of 32 unsplit (fp16 cache only),
# the warp-a-row expansion (--materialize-lanes 0); on an H200 the decode table; then every other
# CUDA test in what is left of DEADLINE (default 560 s).
# Here: `bash scripts/gpu_bundle.sh`; there, .gpu-bundle carried: this script.
source scripts/gpu_run_start.sh run180 --no-peer
dl=${DEADLINE:-560}
el() { echo $(( $(date +%s) - t0 )); }
sel='CudaAttention.*Prefill*:CudaAttention.ExactRows*:CudaDecode.Ragged*'
$T --gtest_filter="$sel" --gtest_brief=1 > $OUT/run180-prefill-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|cuda prefill" $OUT/run180-prefill-tests.log | head -20
echo "prefill tests: $(el) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --prefill --out $OUT/b/ppeer.txt > $OUT/run180-prefill-peer.log 2>&1 || echo "peer failed"
grep PREFILL $OUT/run180-prefill-peer.log | head
echo "prefill peer: $(el) s"
bench() {  # NAME FILTER [flags]
  local name=$1 f=$2; shift 2
  timeout 120 $B --prefill --peer $OUT/b/ppeer.txt --reps 10 --filter "$f" "$@" > $OUT/run180-prefill-bench-$name.log 2>&1 || echo "bench $name rc $?"
  echo "== $name ($f $*)"
  grep -E "^\| (d4b|fp16)|validation" $OUT/run180-prefill-bench-$name.log | awk -F'|' '{print $2"|"$3"|"$4"|"$6"|"$7"|"$10"|"$11"|"$14"|"$15"|"$16}'
}
for f in "fp16 cache" "d4b8/d4b8"; do
  n=${f%% *}; n=${n%%/*}
  bench default-$n "$f"
  bench general-$n "$f" --prefill-exact 0
  bench unsplit-$n "$f" --prefill-exact 1 --prefill-splits 1
  bench split2-$n "$f" --prefill-exact 1 --prefill-splits 2
done
bench tile32-fp16 "fp16 cache" --prefill-exact 2
bench warp-expansion-d4b8 "d4b8/d4b8" --materialize-lanes 0
bench default-d4b12 "d4b12/d8b8"
echo "benches: $(el) s"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && (( $(el) < dl - 200 )); then
  PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/run180-peer.log 2>&1 || echo "peer failed"
  grep PEER $OUT/run180-peer.log
  timeout 150 $B --peer $OUT/b/peer.txt --filter +i8 --reps 20 --skip-step > $OUT/run180-table.log 2>&1 || echo "table rc $?"
  grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |encode keys d4b8 grid |held|FAILED" $OUT/run180-table.log | head -30
  echo "decode: $(el) s"
else
  echo "no decode table (not an H200, or $(el) s gone)"
fi
left=$(( dl - $(el) ))
if (( left > 60 )); then
  timeout $left $T --gtest_brief=1 --gtest_filter="-$sel" > $OUT/run180-tests.log 2>&1 || echo "tests rc $?"
  grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" $OUT/run180-tests.log | head -20
else
  echo "no time left for the other CUDA tests ($left s)"
fi
echo "total: $(el) s"
