#!/usr/bin/env bash
# Run 188 (nineteenth session, 2026-12-07; ran on an H100, figures in docs/cuda-notes.md row 188;
# the Phi-3 table ran past the call's 420 s limit after 4 rows): the plain kernel of head_dim 80/96 with its codebooks of
# at most 256 entries held once per lane of a shared-memory wavefront (AttnParams::plain_cb_rep;
# attn_set_plain_replicated, bench --no-plain-rep), its value codes read from the staged rows (no
# u16 copy) and its value reduction over the tiles' dead shared memory. Run 187's ncu profile had
# the kernel bound by shared-memory wavefronts (L1 82% busy, DRAM 11%), most of them the random
# centroid gathers' bank conflicts and the value codes' 4-way conflicted stores.
# From the repository root with .gpu-bundle carried:
#   bash docs/cuda-runs/run188-plain-replicated.sh run188
# 1. the tests of the change (the new CudaAttention.PlainKernelReplicatedCodebooksChangeNothing,
#    the plain kernel's oracle test, the head_dim 80/96 prefill and fp16-cache tests, the runtime
#    at hd80/hd96); 2. the decode table at 96 and 80 (d4b8 and the defaults, int8 keys) with the
#    peer at the same head_dim, then the same at 96 with one codebook copy (--no-plain-rep: the
#    A/B in one process order, same machine); 3. Phi-3's shape (32 kv heads) at 96.
source scripts/gpu_run_start.sh "$1" --no-peer
$T --gtest_filter='CudaAttention.PlainKernel*:CudaAttention.ExactRowsPrefillAtHeadDims80And96:CudaFP16Cache.*:*CudaRuntimeDeviceCache*hd*' > $OUT/$1-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|\[cuda plain|\[cuda prefill|cuda forward\] (llama|qwen3)-hd.*(VecInfer|perplexity \(VecInfer)" $OUT/$1-tests.log | head -30
echo "tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --out $OUT/b/peer-plain.txt > $OUT/$1-peer-plain.log 2>&1 || echo "peer failed"
grep PEER $OUT/$1-peer-plain.log
$B --peer $OUT/b/peer-plain.txt --plain --filter +i8 --reps 10 > $OUT/$1-table.log 2>&1
grep -E "^\| (96|80) |validation|FAILED" $OUT/$1-table.log | head -20
echo "table: $(( $(date +%s) - t0 )) s"
$B --peer $OUT/b/peer-plain.txt --plain --plain-dim 96 --filter +i8 --reps 10 --no-plain-rep > $OUT/$1-table-norep.log 2>&1
echo "one codebook copy (--no-plain-rep):"
grep -E "^\| 96 |validation|FAILED" $OUT/$1-table-norep.log | head -10
echo "table without copies: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --kv-heads 32 --dims 96 --out $OUT/b/peer-phi3.txt > $OUT/$1-peer-phi3.log 2>&1 || echo "peer failed"
grep PEER $OUT/$1-peer-phi3.log
$B --peer $OUT/b/peer-phi3.txt --plain --plain-kv 32 --plain-dim 96 --filter +i8 --reps 10 > $OUT/$1-phi3-table.log 2>&1
grep -E "^\| 96 |validation|FAILED" $OUT/$1-phi3-table.log | head -8
echo "phi3: $(( $(date +%s) - t0 )) s"
