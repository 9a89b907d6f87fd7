#!/usr/bin/env bash
# Run 196 (twenty-fourth session, 2026-12-07, an H100: the tool kept the held H100 for an H200
# request): the decode peer (cuDNN SDPA, bench/cuda/peer_sdpa.py) and issue 4's head_dim-128
# table with int8 keys, in one call, on the tree of run 195. From the repository root with
# .gpu-bundle's bins carried:   bash docs/cuda-runs/run196-table.sh run196      (~30 s)
source scripts/gpu_run_start.sh "$1"
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 --skip-step > $OUT/$1-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8 \||encode keys d4b8 grid |held|FAILED" $OUT/$1-table.log | head -30
echo "total: $(( $(date +%s) - t0 )) s"
