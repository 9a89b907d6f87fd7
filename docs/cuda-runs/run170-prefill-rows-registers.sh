#!/usr/bin/env bash
# run 170: run 169 with materialize_launch on its register kernel (vq_materialize_kernel: a warp a
# row, four rows in flight a warp, the FWHT by shuffles; run 169 used vq_dequant_kernel's
# shared-memory path). The prefill tests, the prefill table with its fp16 peer, then the decode
# reference (the i8 table with its peer, batch 1 once more: the bars, on whatever card
# came), then every CUDA test. Logs $OUT/run170-*.log.
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried: `bash docs/cuda-runs/run170-prefill-rows-registers.sh`.
set -uo pipefail
source scripts/gpu_prepare.sh
[[ -n $T ]] || { echo "no test program"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
mkdir -p $OUT/b
$T --gtest_filter='CudaAttention.*Prefill*:CudaDecode.Ragged*' --gtest_brief=1 > $OUT/run170-prefill-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|cuda prefill over rows" $OUT/run170-prefill-tests.log | head -20
echo "prefill tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --prefill --out $OUT/b/ppeer.txt > $OUT/run170-prefill-peer.log 2>&1 || echo "peer failed"
$B --prefill --peer $OUT/b/ppeer.txt --reps 20 > $OUT/run170-prefill-bench.log 2>&1
grep -E "^\| (d4b|fp16)|validation|^device" $OUT/run170-prefill-bench.log | awk -F'|' '{print $2"|"$3"|"$4"|"$6"|"$7"|"$10"|"$11"|"$14"|"$15"|"$16}'
echo "prefill bench: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/run170-peer.log 2>&1 || echo "peer failed"
grep PEER $OUT/run170-peer.log
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 > $OUT/run170-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |encode keys d4b8 grid |held|FAILED" $OUT/run170-table.log | head -30
$B --peer $OUT/b/peer.txt --filter +i8 --quick --reps 30 --skip-encode --skip-step > $OUT/run170-batch1.log 2>&1
grep -E "^\| d4b(8|12)/d[48]b8\+i8(kv)? |FAILED" $OUT/run170-batch1.log
echo "decode: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 2>&1 | tee $OUT/run170-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
