#!/usr/bin/env bash
# scripts/gpu_prefill.sh RUN [--decode] — a prefill run on the GPU machine (from the repository
# root, .gpu-bundle carried): the prefill tests and the ragged-batch test, the prefill table with
# its fp16 peer in the same command (bench_decode_cuda --prefill: every path forced, and the
# default), with --decode the decode reference too (the i8 table with its peer, batch 1 once
# more), then every CUDA test. Logs $OUT/RUN-{prefill-tests,prefill-peer,prefill-bench,peer,
# table,batch1,tests}.log. Runs 169-171 (docs/cuda-runs/; run 169 ran the prefill tests without
# the ragged-batch one).
source scripts/gpu_run_start.sh "$1" --no-peer
$T --gtest_filter='CudaAttention.*Prefill*:CudaDecode.Ragged*' --gtest_brief=1 > $OUT/$1-prefill-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|cuda prefill over rows" $OUT/$1-prefill-tests.log | head -20
echo "prefill tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --prefill --out $OUT/b/ppeer.txt > $OUT/$1-prefill-peer.log 2>&1 || echo "peer failed"
$B --prefill --peer $OUT/b/ppeer.txt --reps 20 > $OUT/$1-prefill-bench.log 2>&1
grep -E "^\| (d4b|fp16)|validation|^device" $OUT/$1-prefill-bench.log | awk -F'|' '{print $2"|"$3"|"$4"|"$6"|"$7"|"$10"|"$11"|"$14"|"$15"|"$16}'
echo "prefill bench: $(( $(date +%s) - t0 )) s"
if [[ ${2:-} == --decode ]]; then
  PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/$1-peer.log 2>&1 || echo "peer failed"
  grep PEER $OUT/$1-peer.log
  $B --peer $OUT/b/peer.txt --filter +i8 --reps 20 > $OUT/$1-table.log 2>&1
  grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |encode keys d4b8 grid |held|FAILED" $OUT/$1-table.log | head -30
  $B --peer $OUT/b/peer.txt --filter +i8 --quick --reps 30 --skip-encode --skip-step > $OUT/$1-batch1.log 2>&1
  grep -E "^\| d4b(8|12)/d[48]b8\+i8(kv)? |FAILED" $OUT/$1-batch1.log
  echo "decode: $(( $(date +%s) - t0 )) s"
fi
$T --gtest_brief=1 2>&1 | tee $OUT/$1-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
