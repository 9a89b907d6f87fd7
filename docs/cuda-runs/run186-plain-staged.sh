#!/usr/bin/env bash
# Run 186 (prepared in the fifteenth and sixteenth sessions, run in the nineteenth, 2026-12-07, on an
# H100: part a, then part b on the same warm machine; figures in docs/cuda-notes.md row 186). Two
# changes, both on main since that run:
#  * the plain kernel of head_dim 80 and 96 with its code rows staged into shared memory by
#    cp.async one tile ahead, vectorised centroid and window-row loads, and one instantiation per
#    live-row count (1, 4, 8, 16: a model without GQA, as Phi-2 and Phi-3, scores one row a kv
#    head, not eight). Run 185's version read each thread's code row through L1 a sub-vector at a
#    time and was latency-bound: 0.55x of the fp16 peer at d4b8; this one measured 0.94-1.06x.
#  * prompts at 80/96 on the exact-rows prefill kernel (over the fp16 cache's and the Standard
#    mode's rows, a memory-bound cache's tokens expanded into rows by the lanes expansion kernel at
#    5 and 6 lanes a row, a Stash cache's held rows; history splits and their merge), cuda_support
#    reporting it, and CudaAttention.ExactRowsPrefillAtHeadDims80And96.
# From the repository root with .gpu-bundle carried (bash scripts/gpu_bundle.sh), on the GPU:
#   bash docs/cuda-runs/run186-plain-staged.sh run186 [t|a|b|ab]
#   t: the tests of the change and the d4b8 rows of the decode table (~3 min, for a short budget);
#   a: the tests that draw head_dim 80/96 and the prefill paths, then the decode table at 96 and 80
#      through the cache API with the PyTorch peer at the same head_dim measured in the same command
#      (~6 min on an H100);
#   b: prompts at 96/80 against the peer, then Phi-3's own shape (32 kv heads) at 96 (over 7 min).
source scripts/gpu_run_start.sh "$1" --no-peer
part=${2:-ab}
# part t (a short device budget): the tests of the change, then the head_dim 96/80 d4b8 decode rows
if [[ $part == t ]]; then
$T --gtest_filter='CudaAttention.PlainKernel*:CudaAttention.ExactRows*:CudaAttention.PrefillOverDequantized*:CudaFP16Cache.*' > $OUT/$1-plain-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|\[cuda plain|\[cuda prefill" $OUT/$1-plain-tests.log | head -30
echo "tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --out $OUT/b/peer-plain.txt > $OUT/$1-peer-plain.log 2>&1 || echo "peer failed"
grep PEER $OUT/$1-peer-plain.log
$B --peer $OUT/b/peer-plain.txt --plain --filter 'd4b8/d4b8+i8$' --reps 20 > $OUT/$1-plain-table.log 2>&1
grep -E "^\| (96|80) |validation|FAILED" $OUT/$1-plain-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
fi
if [[ $part == *a* ]]; then
$T --gtest_filter='CudaAttention.PlainKernel*:CudaAttention.ExactRows*:CudaAttention.Prefill*:CudaAttention.AutoPrefillRouting:CudaEncode.*:CudaFP16Cache.*:CudaCache.CreateAndAttention*:CudaAttention.DecodeAndPrefill*:CudaAttention.*Codebooks*:CudaAttention.Int8*:*CudaRuntimeDeviceCache*' > $OUT/$1-plain-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|\[cuda plain|\[cuda prefill|\[cuda attention|cuda forward\] (llama|qwen3)-hd" $OUT/$1-plain-tests.log | head -40
echo "tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --out $OUT/b/peer-plain.txt > $OUT/$1-peer-plain.log 2>&1 || echo "peer failed"
grep PEER $OUT/$1-peer-plain.log
$B --peer $OUT/b/peer-plain.txt --plain --reps 20 > $OUT/$1-plain-table.log 2>&1
grep -E "^device|^\| (96|80) |validation|FAILED" $OUT/$1-plain-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
fi
if [[ $part == *b* ]]; then
# prompts at 96 and 80, by the cache's default path (the exact-rows prefill kernel over rows where
# the grid fills the GPU), against PyTorch SDPA (lower-right causal)
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --prefill --out $OUT/b/peer-plain-prefill.txt > $OUT/$1-peer-plain-prefill.log 2>&1 || echo "peer failed"
grep PREFILL $OUT/$1-peer-plain-prefill.log
$B --peer $OUT/b/peer-plain-prefill.txt --plain --prefill --reps 10 > $OUT/$1-plain-prefill.log 2>&1
grep -E "^\| (96|80) |validation|FAILED" $OUT/$1-plain-prefill.log | head -20
echo "prefill: $(( $(date +%s) - t0 )) s"
# Phi-3's own shape: 32 q / 32 kv heads (no GQA, one live row a kv head), head_dim 96
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --kv-heads 32 --dims 96 --out $OUT/b/peer-phi3.txt > $OUT/$1-peer-phi3.log 2>&1 || echo "peer failed"
grep PEER $OUT/$1-peer-phi3.log
$B --peer $OUT/b/peer-phi3.txt --plain --plain-kv 32 --plain-dim 96 --reps 20 > $OUT/$1-phi3-table.log 2>&1
grep -E "^\| 96 |validation|FAILED" $OUT/$1-phi3-table.log | head -12
echo "phi3: $(( $(date +%s) - t0 )) s"
fi
