#!/usr/bin/env bash
# run 161: the block's position (split, batch, kv head · row chunk) read back from shared memory
# after the coded loop instead of held in registers through it (run161-position-reread.patch):
# ptxas then spills in no attention kernel of the default build (the two-blocks fp16 and i8kv
# four-row kernels spilled 4-8 / 4-12 bytes). The new tree's table with the peer and every CUDA
# test first, then the tree without the change (the patch reversed) built beside it and timed in
# the same command (A/B). Here: the patch applied and the bundle made with .gpu-bundle/base.tar.xz
# (bench_decode_cuda without it: then no base build there); on the GPU machine, from the repository root,
# with .gpu-bundle carried: `bash docs/cuda-runs/run161-position-reread.sh`. A record: it ran once
# (2026-12-06, an H100) with the whole patch applied to af0e00f; the tree after it keeps the change
# in the two-blocks kernels only (docs/cuda-notes.md, row 161), so the patch no longer reverses.
source scripts/gpu_run_start.sh run161
table() {  # $1 binary, $2 label
  echo "== $2"
  $1 --peer $OUT/b/peer.txt --filter +i8 --reps 20 --skip-encode --skip-step > $OUT/run161-$2.log 2>&1
  grep -E "^\| d4b(8|12)/d[48]b8\+i8(kv)? |FAILED" $OUT/run161-$2.log
  $1 --peer $OUT/b/peer.txt --filter 'd4b8/d4b8$' --shape 64x16384 --reps 20 --skip-encode --skip-step 2>&1 | grep -E "^\| d4b8/d4b8 |FAILED"
}
table $B new-1
$T --gtest_brief=1 2>&1 | tee $OUT/run161-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "tests: $(( $(date +%s) - t0 )) s"
base=/tmp/base
if [[ -f .gpu-bundle/base.tar.xz ]]; then  # the tree without the change, built where the bundle was made
  mkdir -p $base/build-gpu/bench && vq_unpack .gpu-bundle/base.tar.xz $base/build-gpu/bench
else
mkdir -p $base && tar --exclude=./build-gpu --exclude=./build --exclude=./.gpu-bundle -cf - . | tar -C $base -xf -
(cd $base && patch -R -p1 < docs/cuda-runs/run161-position-reread.patch) > /dev/null || { echo "reverse patch failed"; exit 1; }
d=$PWD/.gpu-bundle/deps
(cd $base && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DVQ_CUDA=ON -DVQ_GTEST_SOURCE_DIR=$d/googletest \
   -DICU_ROOT=$d/icu -DCMAKE_CXX_FLAGS="-isystem $d/include" -DCMAKE_CUDA_FLAGS="-isystem $d/include" > /tmp/base.log 2>&1 &&
 cmake --build build-gpu -j "$(nproc)" --target bench_decode_cuda >> /tmp/base.log 2>&1) || { echo "base build failed"; tail -20 /tmp/base.log; exit 1; }
fi
echo "base built: $(( $(date +%s) - t0 )) s"
table $base/build-gpu/bench/bench_decode_cuda base-1
table $B new-2
table $base/build-gpu/bench/bench_decode_cuda base-2
echo "total: $(( $(date +%s) - t0 )) s"
