#!/usr/bin/env bash
# Run 191 (twentieth session, 2026-12-07, an H100; figures in docs/cuda-notes.md rows 189-191):
# device calls on one warm machine, from the repository root with .gpu-bundle carried. It held the
# tree's programs (bins.tar.xz) and run 190's patched ones (bins190.tar.xz: the patch, in git
# history at 2e63e61 as docs/cuda-runs/run190-plain-softmax-fused.patch, applied to 2e63e61;
# vq_test_cuda and bench_decode_cuda built by scripts/gpu_bundle.sh's build, tarred by hand), so
# the A/B ran in one call with one peer. Run 190 is on main now: to repeat the A/B, build the
# baseline from 2e63e61 into bins190.tar.xz and read the labels the other way round.
#   bash docs/cuda-runs/run191-suite-and-190.sh run191 suite   main + head dims 112/160/192 on the
#        plain kernel: every CUDA test (the tree of run 188 + the one-fill codebooks + the cached
#        shared-memory attributes had not run them all) and run 189's ncu profile of the plain
#        kernel (NR 1 and NR 4, hd96 d4b8 i8)                                        (~7 min)
#   bash docs/cuda-runs/run191-suite-and-190.sh run191 final   after landing run 190's patch on the
#        split kernel files: the plain kernel's tests, the random attention cases, cuda_support's
#        agreement, the fp16 cache and the runtime at hd80/96, on the final tree      (~2 min)
#   bash docs/cuda-runs/run191-suite-and-190.sh run191 dims    the decode table at head_dim 112,
#        160 and 192 (d4b8 and the defaults, int8 keys, 8 kv heads) with the peer at each  (~5 min)
#   bash docs/cuda-runs/run191-suite-and-190.sh run191 ab      run 190: its tests on the patched
#        programs, then Phi-3's shape (32 kv heads, hd96) and the GQA-4 hd96 / hd80 tables, d4b8 i8,
#        main then patched, one peer each                                           (~7 min)
source scripts/gpu_run_start.sh "$1" --no-peer
R=$1-${2:?suite or ab}
if [[ $2 == suite ]]; then
  $T --gtest_brief=1 > $OUT/$R-tests.log 2>&1
  grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" $OUT/$R-tests.log | head -40
  echo "tests: $(( $(date +%s) - t0 )) s"
  bash docs/cuda-runs/run189-plain-profile.sh $1-189 2>&1 | grep -v "^gpu_prepare\|^NVIDIA\|^[A-Z].*, [0-9]* MHz"
  echo "total: $(( $(date +%s) - t0 )) s"
  exit 0
fi
if [[ $2 == final ]]; then  # run 190 landed on the split files: the plain kernel's tests again
  $T --gtest_filter='CudaAttention.PlainKernel*:CudaAttention.DecodeAndPrefillMatchTheOracleOnCodes:CudaCache.CreateAndAttentionAgreeWithCudaSupport:CudaFP16Cache.*:*CudaRuntimeDeviceCache*hd*' > $OUT/$R-tests.log 2>&1
  grep -E "^\[  (PASSED|FAILED) |FAILED|\[cuda plain|\[cuda attention\]|create/cuda_support" $OUT/$R-tests.log | head -20
  echo "total: $(( $(date +%s) - t0 )) s"
  exit 0
fi
if [[ $2 == dims ]]; then
  PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --dims 112,160,192 --out $OUT/b/peer-dims.txt > $OUT/$R-peer.log 2>&1 || echo "peer failed"
  grep PEER $OUT/$R-peer.log
  for d in 112 160 192; do
    $B --peer $OUT/b/peer-dims.txt --plain --plain-dim $d --filter +i8 --reps 10 > $OUT/$R-table-$d.log 2>&1
    grep -E "^\| $d \| d4b(8|12)/d[48]b8\+i8 |validation|FAILED" $OUT/$R-table-$d.log | head -8
    echo "hd$d: $(( $(date +%s) - t0 )) s"
  done
  exit 0
fi
mkdir -p $OUT/p190 && vq_unpack .gpu-bundle/bins190.tar.xz $OUT/p190
T190=$OUT/p190/tests/vq_test_cuda B190=$OUT/p190/bench/bench_decode_cuda
$T190 --gtest_filter='CudaAttention.PlainKernel*:CudaAttention.ExactRowsPrefillAtHeadDims80And96:CudaFP16Cache.*:*CudaRuntimeDeviceCache*hd*' > $OUT/$R-tests190.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|\[cuda plain" $OUT/$R-tests190.log | head -20
echo "tests (190): $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --kv-heads 32 --dims 96 --out $OUT/b/peer-phi3.txt > $OUT/$R-peer-phi3.log 2>&1 || echo "peer failed"
grep PEER $OUT/$R-peer-phi3.log
for v in main 190; do
  b=$B; [[ $v == 190 ]] && b=$B190
  $b --peer $OUT/b/peer-phi3.txt --plain --plain-kv 32 --plain-dim 96 --filter 'd4b8/d4b8+i8$' --reps 10 > $OUT/$R-phi3-$v.log 2>&1
  echo "phi3 $v:"; grep -E "^\| 96 |validation|FAILED" $OUT/$R-phi3-$v.log | head -4
done
echo "phi3: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --out $OUT/b/peer-plain.txt > $OUT/$R-peer-plain.log 2>&1 || echo "peer failed"
grep PEER $OUT/$R-peer-plain.log
for v in main 190; do
  b=$B; [[ $v == 190 ]] && b=$B190
  $b --peer $OUT/b/peer-plain.txt --plain --filter 'd4b8/d4b8+i8$' --reps 10 > $OUT/$R-plain-$v.log 2>&1
  echo "gqa4 $v:"; grep -E "^\| (96|80) |validation|FAILED" $OUT/$R-plain-$v.log | head -8
done
echo "total: $(( $(date +%s) - t0 )) s"
