#!/usr/bin/env bash
# Run 185: head_dim 80 and 96 on the device (the plain attention kernel, attention_any_dim.cu, and
# the encoder's block-diagonal Hadamard): the tests that draw these head dims first, then the decode
# table at 96 and 80 through the cache API with the PyTorch peer at the same head_dim measured in
# the same command (peer_sdpa.py --plain), then every CUDA test and the command line's tests.
#   bash docs/cuda-runs/run185-plain-head-dims.sh run185
source scripts/gpu_run_start.sh "$1" --no-peer
$T --gtest_filter='CudaAttention.PlainKernel*:CudaEncode.*:CudaFP16Cache.*:CudaCache.CreateAndAttention*:CudaAttention.DecodeAndPrefill*:CudaAttention.*Codebooks*:CudaAttention.Int8*:*CudaRuntimeDeviceCache*' > $OUT/$1-plain-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|\[cuda plain|\[cuda attention|cuda forward\] (llama|qwen3)_?-?hd" $OUT/$1-plain-tests.log | head -40
echo "tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --out $OUT/b/peer-plain.txt > $OUT/$1-peer-plain.log 2>&1 || echo "peer failed"
grep PEER $OUT/$1-peer-plain.log
$B --peer $OUT/b/peer-plain.txt --plain --reps 20 > $OUT/$1-plain-table.log 2>&1
grep -E "^device|^\| (96|80) |validation|FAILED" $OUT/$1-plain-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
# Then, on the same warm machine (one more call), every CUDA test of the final tree and the CLI's:
#   source scripts/gpu_prepare.sh; $T --gtest_brief=1 > $OUT/run185-tests.log 2>&1; $E --gtest_filter='Cli.*'
