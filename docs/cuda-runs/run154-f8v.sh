#!/usr/bin/env bash
# run 154, second command (same machine, after run154-build-tests.sh and the fix of the cache's
# i8f8 codebook pointers): the i8f8 test, then the i8 table (+i8, +i8kv and the new +i8f8 rows,
# the defaults) with the peer in the same command, a second repetition of the d4b8 rows and a
# profile of the i8 and i8f8 rows at batch 1. Here: `bash scripts/gpu_bundle.sh`; on the GPU
# machine, from the repository root, with .gpu-bundle carried: `bash docs/cuda-runs/run154-f8v.sh`.
# The I8F8 code is not on main (slower than i8 on sm_90: docs/cuda-notes.md, run 154); to rerun,
# apply docs/cuda-runs/run154-i8f8.patch to 613e94f first (git apply).
set -uo pipefail
source scripts/gpu_prepare.sh
[[ -n $T ]] || { echo "no test program"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
$T --gtest_filter='CudaAttention.Int8KeysAndFp8Values*' 2>&1 | tee $OUT/run154-f8-test2.log | grep -E "OK \]|FAILED|cuda attention" | head -20
echo "f8 test: $(( $(date +%s) - t0 )) s"
mkdir -p $OUT/b
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/run154-peer.log 2>&1 || echo "peer failed"
grep PEER $OUT/run154-peer.log
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 > $OUT/run154-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(f8)? |validation|held" $OUT/run154-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
$B --peer $OUT/b/peer.txt --filter d4b8/d4b8+i8 --reps 20 --skip-encode --skip-step > $OUT/run154-ab2.log 2>&1
grep -E "^\| d4b8/d4b8\+i8" $OUT/run154-ab2.log
for f in 'd4b8/d4b8+i8$' 'd4b8/d4b8+i8f8$'; do
  $B --filter "$f" --reps 10 --skip-encode --skip-step --profile --quick > $OUT/run154-profile-$(echo $f | tr -d '/$+').log 2>&1
done
grep -hE "^d4b8|setup|coded loop|window \(|combine|arrival|merge" $OUT/run154-profile-*.log | head -40
echo "total: $(( $(date +%s) - t0 )) s"
