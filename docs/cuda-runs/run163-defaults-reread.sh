#!/usr/bin/env bash
# run 163: is run 161's batch-1 cost for the defaults real? Run 161 measured the position re-read
# (split, batch, kv head · row chunk read back from shared memory after the coded loop) in every
# kernel: the defaults' one-block kernel (they have no two-blocks kernel) gained 1.2% at 64x16384
# and lost ~0.5% at 1x131072, two repetitions each, so the tree kept it out of that kernel. Here
# the re-read also in the d4b12/d8b8 kernels (run163-defaults-reread.patch, "new": the bundled
# programs) against the committed tree ("base": .gpu-bundle/base.tar.xz, bench_decode_cuda built
# here before the patch). First the base's whole i8 table with the peer (the reference of the
# tree as committed), then four alternating repetitions of the defaults' i8 rows, then the new
# tree's CUDA tests. A record: it ran once (2026-12-06, an H100) and the patch was dropped
# (docs/cuda-notes.md, row 163), so main is the base. Here: apply the patch, `bash scripts/gpu_bundle.sh`, put the committed
# tree's bench in base.tar.xz; there, with .gpu-bundle carried: `bash docs/cuda-runs/run163-defaults-reread.sh`.
source scripts/gpu_run_start.sh run163
base=/tmp/base
mkdir -p $base && vq_unpack .gpu-bundle/base.tar.xz $base
BB=$base/bench_decode_cuda
$BB --peer $OUT/b/peer.txt --filter +i8 --reps 20 > $OUT/run163-base-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |encode keys d4b8 grid |held|FAILED" $OUT/run163-base-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
for r in 1 2 3 4; do
  for v in new base; do
    bin=$B; [[ $v == base ]] && bin=$BB
    $bin --peer $OUT/b/peer.txt --filter 'd4b12/d8b8+i8$' --reps 30 --skip-encode --skip-step > $OUT/run163-$v-$r.log 2>&1
    echo "$v $r: $(grep -E '^\| d4b12/d8b8\+i8 ' $OUT/run163-$v-$r.log | awk -F'|' '{printf "%s ", $4}') $(grep -c FAILED $OUT/run163-$v-$r.log) failed"
  done
done
echo "ab: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 2>&1 | tee $OUT/run163-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
