#!/usr/bin/env bash
# Run 197 (twenty-fifth session, 2026-12-07): the plain kernel at head_dim 64, 128 and 256 for
# every configuration no tuned kernel serves (the default build refused d8b12/d8b12 at 128 and
# every configuration at 256 before), and the int8 query's oracle for tiny queries. From the
# repository root with .gpu-bundle's bins carried:
#   bash docs/cuda-runs/run197-plain-fallback.sh run197 a   the decode peer and issue 4's head_dim-128
#        table (d4b8 and the defaults, int8 keys), then every CUDA test              (~8 min)
#   bash docs/cuda-runs/run197-plain-fallback.sh run197 b   the fallback's speed: the cache-API
#        decode table at head_dim 128 (d8b12/d8b12 on the plain kernel beside the tuned d4b8)
#        and 256 (every configuration on the plain kernel), the peer at both    (~4 min)
#   bash docs/cuda-runs/run197-plain-fallback.sh run197 t   every CUDA test only (~6 min)
#   bash docs/cuda-runs/run197-plain-fallback.sh run197 s   every CUDA test but the runtime's (CudaRuntime*)
M=${2:?a, t, s or b}
if [[ $M == a || $M == t || $M == s ]]; then
  if [[ $M == a ]]; then
    source scripts/gpu_run_start.sh "$1"
    $B --peer $OUT/b/peer.txt --filter +i8 --reps 20 --skip-step > $OUT/$1-a-table.log 2>&1
    grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8 \||encode keys d4b8 grid |held|FAILED" $OUT/$1-a-table.log | head -30
    echo "table: $(( $(date +%s) - t0 )) s"
  else
    source scripts/gpu_run_start.sh "$1" --no-peer
  fi
  R=$1-$M
  F='*'; [[ $M == s ]] && F='-*CudaRuntime*'
  $T --gtest_brief=1 --gtest_filter="$F" > $OUT/$R-tests.log 2>&1
  grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|\[cuda plain|tiny- or zero|Skipped" $OUT/$R-tests.log | head -40
  echo "tests: $(( $(date +%s) - t0 )) s"
  exit 0
fi
source scripts/gpu_run_start.sh "$1" --no-peer
R=$1-b
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --dims 128,256 --out $OUT/b/peer-dims.txt > $OUT/$R-peer.log 2>&1 || echo "peer failed"
grep PEER $OUT/$R-peer.log
$B --peer $OUT/b/peer-dims.txt --plain --plain-dim 128 --filter d8b12 --reps 10 > $OUT/$R-table-128.log 2>&1
grep -E "^\| 128 |validation|FAILED" $OUT/$R-table-128.log | head -8
echo "hd128: $(( $(date +%s) - t0 )) s"
for c in 'd4b8/d4b8+i8$' 'd4b12/d8b8+i8$'; do
  $B --peer $OUT/b/peer-dims.txt --plain --plain-dim 256 --filter "$c" --reps 10 > $OUT/$R-table-256-${c:0:4}.log 2>&1
  grep -E "^\| 256 |validation|FAILED" $OUT/$R-table-256-${c:0:4}.log | head -8
  echo "hd256 $c: $(( $(date +%s) - t0 )) s"
done
