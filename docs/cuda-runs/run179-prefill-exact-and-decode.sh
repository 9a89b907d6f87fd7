#!/usr/bin/env bash
# run 179 (2026-12-06, thirteenth session): run 178's question in one call of at most 600 s, with
# the decode reference added where the card is an H200 (the bars are set there).
#  1. the prefill tests: the exact-rows kernel's (both kernels, both tile sizes), the rows path's
#     (both expansions), the ragged batch;
#  2. the prefill table, the fp16 peer in the same command: the fp16 cache and d4b8 with the
#     exact-rows kernel (--prefill-exact 1) and without it (0, the default until now), then d4b8
#     with run 177's lanes expansion (--materialize-lanes) on the exact-rows kernel;
#  3. on an H200 only: the decode peer and the i8 decode table (d4b8 and the defaults, three shapes);
#  4. every other CUDA test, in what is left of DEADLINE (default 560 s).
# Here: `bash scripts/gpu_bundle.sh` where the sources changed; there, .gpu-bundle carried: this script.
source scripts/gpu_run_start.sh run179 --no-peer
dl=${DEADLINE:-560}
el() { echo $(( $(date +%s) - t0 )); }
$T --gtest_filter='CudaAttention.*Prefill*:CudaDecode.Ragged*' --gtest_brief=1 > $OUT/run179-prefill-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|cuda prefill" $OUT/run179-prefill-tests.log | head -20
echo "prefill tests: $(el) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --prefill --out $OUT/b/ppeer.txt > $OUT/run179-prefill-peer.log 2>&1 || echo "peer failed"
grep PREFILL $OUT/run179-prefill-peer.log | head
echo "prefill peer: $(el) s"
bench() {  # NAME FILTER [flags]
  local name=$1 f=$2; shift 2
  timeout 120 $B --prefill --peer $OUT/b/ppeer.txt --reps 10 --filter "$f" "$@" > $OUT/run179-prefill-bench-$name.log 2>&1 || echo "bench $name rc $?"
  echo "== $name ($f $*)"
  grep -E "^\| (d4b|fp16)|validation" $OUT/run179-prefill-bench-$name.log | awk -F'|' '{print $2"|"$3"|"$4"|"$6"|"$7"|"$10"|"$11"|"$14"|"$15"|"$16}'
  echo "t: $(el) s"
}
bench exact-fp16 "fp16 cache" --prefill-exact 1
bench general-fp16 "fp16 cache" --prefill-exact 0
bench exact-d4b8 "d4b8/d4b8" --prefill-exact 1
bench general-d4b8 "d4b8/d4b8" --prefill-exact 0
bench exact-lanes-d4b8 "d4b8/d4b8" --prefill-exact 1 --materialize-lanes
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && (( $(el) < dl - 200 )); then
  PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/run179-peer.log 2>&1 || echo "peer failed"
  grep PEER $OUT/run179-peer.log
  timeout 150 $B --peer $OUT/b/peer.txt --filter +i8 --reps 20 --skip-step > $OUT/run179-table.log 2>&1 || echo "table rc $?"
  grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |encode keys d4b8 grid |held|FAILED" $OUT/run179-table.log | head -30
  echo "decode: $(el) s"
else
  echo "no decode table (not an H200, or $(el) s gone)"
fi
left=$(( dl - $(el) ))
if (( left > 60 )); then
  timeout $left $T --gtest_brief=1 --gtest_filter='-CudaAttention.*Prefill*:CudaDecode.Ragged*' > $OUT/run179-tests.log 2>&1 || echo "tests rc $?"
  grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" $OUT/run179-tests.log | head -20
else
  echo "no time left for the other CUDA tests ($left s)"
fi
echo "total: $(el) s"
