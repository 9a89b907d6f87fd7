#!/usr/bin/env bash
# Run 186: the plain kernel of head_dim 80 and 96 with its code rows staged by cp.async one tile
# ahead and an instantiation per live-row count (1, 4, 8, 16); run 185 was the first version (0.55x
# of the fp16 peer at d4b8: latency-bound on per-thread code loads). As run 185: the tests that
# draw these head dims, then the decode table at 96 and 80 through the cache API with the PyTorch
# peer at the same head_dim measured in the same command (peer_sdpa.py --plain). (Every CUDA test
# ran in run 185 on the tree before, whose other sources this run's tree keeps.)
#   bash docs/cuda-runs/run186-plain-staged.sh run186
source scripts/gpu_run_start.sh "$1" --no-peer
$T --gtest_filter='CudaAttention.PlainKernel*:CudaEncode.*:CudaFP16Cache.*:CudaCache.CreateAndAttention*:CudaAttention.DecodeAndPrefill*:CudaAttention.*Codebooks*:CudaAttention.Int8*:*CudaRuntimeDeviceCache*' > $OUT/$1-plain-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|\[cuda plain|\[cuda attention|cuda forward\] (llama|qwen3)_?-?hd" $OUT/$1-plain-tests.log | head -40
echo "tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --out $OUT/b/peer-plain.txt > $OUT/$1-peer-plain.log 2>&1 || echo "peer failed"
grep PEER $OUT/$1-peer-plain.log
$B --peer $OUT/b/peer-plain.txt --plain --reps 20 > $OUT/$1-plain-table.log 2>&1
grep -E "^device|^\| (96|80) |validation|FAILED" $OUT/$1-plain-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
