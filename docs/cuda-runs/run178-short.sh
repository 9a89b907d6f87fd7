#!/usr/bin/env bash
# run 178, the short form (the session's device time was nearly spent on refused starts): the
# exact-rows kernel's test and the rows-path test, then the prefill table's fp16-cache and d4b8
# rows with the exact-rows kernel (default) and without it (--prefill-exact 0), the peer in the
# same command. The full form: docs/cuda-runs/run178-prefill-exact-kernel.sh.
source scripts/gpu_run_start.sh run178 --no-peer
$T --gtest_filter='CudaAttention.ExactRows*:CudaAttention.PrefillOverDequantized*' --gtest_brief=1 > $OUT/run178-prefill-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|cuda prefill" $OUT/run178-prefill-tests.log | head -20
echo "prefill tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --prefill --out $OUT/b/ppeer.txt > $OUT/run178-prefill-peer.log 2>&1 || echo "peer failed"
echo "peer: $(( $(date +%s) - t0 )) s"
for which in exact general; do
  flag="--prefill-exact 1"; [[ $which == general ]] && flag="--prefill-exact 0"
  for f in "fp16 cache" "d4b8/d4b8"; do
    timeout 100 $B --prefill --peer $OUT/b/ppeer.txt --reps 10 $flag --filter "$f" > "$OUT/run178-prefill-bench-$which-${f%% *}.log" 2>&1 || echo "bench rc $?"
    echo "== $which $f"; grep -E "^\| (d4b|fp16)|validation" "$OUT/run178-prefill-bench-$which-${f%% *}.log" | awk -F'|' '{print $2"|"$3"|"$4"|"$6"|"$7"|"$10"|"$11"|"$14"|"$15"|"$16}'
    echo "t: $(( $(date +%s) - t0 )) s"
  done
done
