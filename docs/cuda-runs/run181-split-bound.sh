#!/usr/bin/env bash
# run 181 (2026-12-06, thirteenth session): run 180's tree with the history split's bound raised
# from 16 to 160 tiles of 64 tokens a share (run 180: 128 blocks over 2 shares 6% slower than
# vq_prefill_kernel at 4352 tokens a share, 4% faster at 16640): the exact-rows tests (the routing
# test's split case now over 24576 tokens of history), the prefill table's defaults against
# vq_prefill_kernel with the peer in the same command, the decode table on an H200, then every
# other CUDA test in what is left of DEADLINE (default 560 s).
source scripts/gpu_run_start.sh run181 --no-peer
dl=${DEADLINE:-560}
el() { echo $(( $(date +%s) - t0 )); }
sel='CudaAttention.*Prefill*:CudaAttention.ExactRows*:CudaDecode.Ragged*'
$T --gtest_filter="$sel" --gtest_brief=1 > $OUT/run181-prefill-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|cuda prefill" $OUT/run181-prefill-tests.log | head -20
echo "prefill tests: $(el) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --prefill --out $OUT/b/ppeer.txt > $OUT/run181-prefill-peer.log 2>&1 || echo "peer failed"
grep PREFILL $OUT/run181-prefill-peer.log | head
bench() {  # NAME FILTER [flags]
  local name=$1 f=$2; shift 2
  timeout 120 $B --prefill --peer $OUT/b/ppeer.txt --reps 10 --filter "$f" "$@" > $OUT/run181-prefill-bench-$name.log 2>&1 || echo "bench $name rc $?"
  echo "== $name ($f $*)"
  grep -E "^\| (d4b|fp16)|validation" $OUT/run181-prefill-bench-$name.log | awk -F'|' '{print $2"|"$3"|"$4"|"$6"|"$7"|"$10"|"$11"|"$14"|"$15"|"$16}'
}
bench default ""
bench general "" --prefill-exact 0 --materialize-lanes 0
echo "benches: $(el) s"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && (( $(el) < dl - 200 )); then
  PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/run181-peer.log 2>&1 || echo "peer failed"
  grep PEER $OUT/run181-peer.log
  timeout 150 $B --peer $OUT/b/peer.txt --filter +i8 --reps 20 --skip-step > $OUT/run181-table.log 2>&1 || echo "table rc $?"
  grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |encode keys d4b8 grid |held|FAILED" $OUT/run181-table.log | head -30
  echo "decode: $(el) s"
else
  echo "no decode table (not an H200, or $(el) s gone)"
fi
left=$(( dl - $(el) ))
if (( left > 60 )); then
  timeout $left $T --gtest_brief=1 --gtest_filter="-$sel" > $OUT/run181-tests.log 2>&1 || echo "tests rc $?"
  grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" $OUT/run181-tests.log | head -20
else
  echo "no time left for the other CUDA tests ($left s)"
fi
echo "total: $(el) s"
