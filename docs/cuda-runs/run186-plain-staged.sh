#!/usr/bin/env bash
# Run 186 — PREPARED, NOT RUN (the fifteenth session's device time was spent on failed starts).
# The plain kernel of head_dim 80 and 96 with its code rows staged into shared memory by cp.async
# one tile ahead, vectorised centroid and window-row loads, and one instantiation per live-row
# count (1, 4, 8, 16: a model without GQA, as Phi-2 and Phi-3, scores one row a kv head, not
# eight). Run 185's version (on main) read each thread's code row through L1 a sub-vector at a
# time and was latency-bound: 0.55x of the fp16 peer at d4b8. The change is a patch, not on main
# until it has run on a GPU:
#   git apply docs/cuda-runs/run186-plain-staged.patch && bash scripts/gpu_bundle.sh
# (compiled here for sm_90 and sm_80, and CI passed with it: commit 4ddc27e; ptxas: 128 registers,
# 12-100 bytes of spills in the NR <= 8 instantiations, up to 376 in NR = 16). Then, on the GPU:
#   bash docs/cuda-runs/run186-plain-staged.sh run186 [a|b]   (a: tests and the decode table;
#   b: Phi-3's shape and prompts; both by default, ~10 min)
# The tests that draw head_dim 80/96, then the decode table at 96 and 80 through the cache API
# with the PyTorch peer at the same head_dim measured in the same command; then Phi-3's own shape
# (32 kv heads) at 96.
source scripts/gpu_run_start.sh "$1" --no-peer
part=${2:-ab}
if [[ $part == *a* ]]; then
$T --gtest_filter='CudaAttention.PlainKernel*:CudaEncode.*:CudaFP16Cache.*:CudaCache.CreateAndAttention*:CudaAttention.DecodeAndPrefill*:CudaAttention.*Codebooks*:CudaAttention.Int8*:*CudaRuntimeDeviceCache*' > $OUT/$1-plain-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|\[cuda plain|\[cuda attention|cuda forward\] (llama|qwen3)-hd" $OUT/$1-plain-tests.log | head -40
echo "tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --out $OUT/b/peer-plain.txt > $OUT/$1-peer-plain.log 2>&1 || echo "peer failed"
grep PEER $OUT/$1-peer-plain.log
$B --peer $OUT/b/peer-plain.txt --plain --reps 20 > $OUT/$1-plain-table.log 2>&1
grep -E "^device|^\| (96|80) |validation|FAILED" $OUT/$1-plain-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
fi
if [[ $part == *b* ]]; then
# Phi-3's own shape: 32 q / 32 kv heads (no GQA, one live row a kv head), head_dim 96
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --kv-heads 32 --dims 96 --out $OUT/b/peer-phi3.txt > $OUT/$1-peer-phi3.log 2>&1 || echo "peer failed"
grep PEER $OUT/$1-peer-phi3.log
$B --peer $OUT/b/peer-phi3.txt --plain --plain-kv 32 --plain-dim 96 --reps 20 > $OUT/$1-phi3-table.log 2>&1
grep -E "^\| 96 |validation|FAILED" $OUT/$1-phi3-table.log | head -12
echo "phi3: $(( $(date +%s) - t0 )) s"
# prompts at 96 and 80: the plain kernel's row chunks against PyTorch SDPA (lower-right causal)
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --prefill --out $OUT/b/peer-plain-prefill.txt > $OUT/$1-peer-plain-prefill.log 2>&1 || echo "peer failed"
grep PREFILL $OUT/$1-peer-plain-prefill.log
$B --peer $OUT/b/peer-plain-prefill.txt --plain --prefill --reps 10 > $OUT/$1-plain-prefill.log 2>&1
grep -E "^\| (96|80) |validation|FAILED" $OUT/$1-plain-prefill.log | head -20
echo "prefill: $(( $(date +%s) - t0 )) s"
fi
