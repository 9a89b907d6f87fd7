#!/usr/bin/env bash
# Run 192 (twenty-first session, 2026-12-07): the final tree of the twentieth session (e26df31: run
# 190's fused softmax on the split plain-kernel files, head dims 112/160/192), which no GPU had run,
# plus this session's decode steps through CUDA graphs in the runtime (CudaModelOptions::
# cuda_graphs; CudaKVCache::advance_seq_lens and capture_key). From the repository root with
# .gpu-bundle carried:
#   bash docs/cuda-runs/run192-final-tree.sh run192 main    every CUDA test, then bench_runtime_decode
#        (the runtime's decode calls, eager against graph replays in the same run) on three model
#        shapes                                                                          (~8 min)
#   bash docs/cuda-runs/run192-final-tree.sh run192 tables  the peer and the head_dim 128 decode
#        table (issue 4's: d4b8 and the defaults, int8 keys), then head dims 80/96 and 112/160/192
#        with a peer each (~10 min on an H100: run 192's call stopped at its 560 s limit before
#        hd192, which ran in a call of its own, the same two commands)
M=${2:?main or tables}
if [[ $M == main ]]; then
  source scripts/gpu_run_start.sh "$1" --no-peer
  R=$1-main
  $T --gtest_brief=1 > $OUT/$R-tests.log 2>&1
  grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped|cuda forward graphs" $OUT/$R-tests.log | head -60
  echo "tests: $(( $(date +%s) - t0 )) s"
  [[ -n $RD ]] || { echo "no bench_runtime_decode"; exit 1; }
  for p in "tiny --ctx 1024" "qwen0.5b --ctx 4096" "llama8b-2l --ctx 4096"; do
    $RD --preset $p --steps 128 --reps 3 > $OUT/$R-runtime-${p%% *}.log 2>&1
    cat $OUT/$R-runtime-${p%% *}.log
    echo "runtime ${p%% *}: $(( $(date +%s) - t0 )) s"
  done
  exit 0
fi
source scripts/gpu_run_start.sh "$1"
R=$1-tables
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 --skip-step > $OUT/$R-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8 \||encode keys d4b8 grid |held|FAILED" $OUT/$R-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --out $OUT/b/peer-plain.txt > $OUT/$R-peer-plain.log 2>&1 || echo "peer failed"
grep PEER $OUT/$R-peer-plain.log
$B --peer $OUT/b/peer-plain.txt --plain --filter +i8 --reps 10 > $OUT/$R-plain.log 2>&1
grep -E "^\| (96|80) \| d4b(8|12)/d[48]b8\+i8 |validation|FAILED" $OUT/$R-plain.log | head -12
echo "plain: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --plain --dims 112,160,192 --out $OUT/b/peer-dims.txt > $OUT/$R-peer-dims.log 2>&1 || echo "peer failed"
grep PEER $OUT/$R-peer-dims.log
for d in 112 160 192; do
  $B --peer $OUT/b/peer-dims.txt --plain --plain-dim $d --filter +i8 --reps 10 > $OUT/$R-dims-$d.log 2>&1
  grep -E "^\| $d \| d4b(8|12)/d[48]b8\+i8 |validation|FAILED" $OUT/$R-dims-$d.log | head -8
  echo "hd$d: $(( $(date +%s) - t0 )) s"
done
