#!/usr/bin/env bash
# Run 190 (prepared in the nineteenth session; measured in the twentieth as part of run 191, an
# H100, and landed: figures in docs/cuda-notes.md row 190; the patch file is in git history at
# 2e63e61, docs/cuda-runs/run190-plain-softmax-fused.patch): the
# plain kernel of head_dim 80/96 without its softmax pass. Before it, a warp a row made a pass over
# the tile's scores (max, exp2, sum) between two barriers while the other warps waited: at one live
# row (Phi-2 and Phi-3 decode: no GQA) seven warps of eight. Now each thread keeps its token's
# scores in registers, the tile's row maxima come from warp shuffles and the eight warps' maxima,
# each thread writes its token's probabilities token-major (the value phase reads a token's 4 or 8
# rows in one or two 16-byte loads instead of 4 or 8 scalar ones) and keeps running sums of its own,
# combined once at the end; the running max, the same in every thread, sits in two shared buffers
# (tile j reads one and writes the other). ptxas: NR = 1 96 registers (119-121 before), NR = 4 128
# with no spill, NR = 8 8-100 bytes of spills (8-44 before), NR = 16 up to 1160 (136-492 before; the
# 16-row chunks serve prompts only where the exact-rows prefill kernel does not).
# On main now: `bash docs/cuda-runs/run190-plain-softmax-fused.sh run190` (~6 min on an H100, from the
# repository root with .gpu-bundle carried) reruns its tests and tables against the landed kernel.
source scripts/gpu_run_start.sh "$1" --no-peer
$T --gtest_filter='CudaAttention.PlainKernel*:CudaAttention.ExactRowsPrefillAtHeadDims80And96:CudaFP16Cache.*:*CudaRuntimeDeviceCache*hd*' > $OUT/$1-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|\[cuda plain|\[cuda prefill" $OUT/$1-tests.log | head -30
echo "tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --kv-heads 32 --dims 96 --out $OUT/b/peer-phi3.txt > $OUT/$1-peer-phi3.log 2>&1 || echo "peer failed"
grep PEER $OUT/$1-peer-phi3.log
$B --peer $OUT/b/peer-phi3.txt --plain --plain-kv 32 --plain-dim 96 --filter +i8 --reps 10 > $OUT/$1-phi3-table.log 2>&1
grep -E "^\| 96 |validation|FAILED" $OUT/$1-phi3-table.log | head -8
echo "phi3: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --out $OUT/b/peer-plain.txt > $OUT/$1-peer-plain.log 2>&1 || echo "peer failed"
grep PEER $OUT/$1-peer-plain.log
$B --peer $OUT/b/peer-plain.txt --plain --filter +i8 --reps 10 > $OUT/$1-table.log 2>&1
grep -E "^\| (96|80) |validation|FAILED" $OUT/$1-table.log | head -20
echo "table: $(( $(date +%s) - t0 )) s"
