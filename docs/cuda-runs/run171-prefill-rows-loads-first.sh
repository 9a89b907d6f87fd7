#!/usr/bin/env bash
# run 171: run 170 with vq_materialize_kernel issuing every load of its four rows before using
# any (lengths, code words, the ring's row, λ), so a row costs two dependent round trips instead of
# four. The prefill tests, the prefill table with its fp16 peer, then every CUDA test.
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried: `bash docs/cuda-runs/run171-prefill-rows-loads-first.sh`.
set -uo pipefail
source scripts/gpu_prepare.sh
[[ -n $T ]] || { echo "no test program"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
mkdir -p $OUT/b
$T --gtest_filter='CudaAttention.*Prefill*:CudaDecode.Ragged*' --gtest_brief=1 > $OUT/run171-prefill-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|cuda prefill over rows" $OUT/run171-prefill-tests.log | head -20
echo "prefill tests: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --prefill --out $OUT/b/ppeer.txt > $OUT/run171-prefill-peer.log 2>&1 || echo "peer failed"
$B --prefill --peer $OUT/b/ppeer.txt --reps 20 > $OUT/run171-prefill-bench.log 2>&1
grep -E "^\| (d4b|fp16)|validation|^device" $OUT/run171-prefill-bench.log | awk -F'|' '{print $2"|"$3"|"$4"|"$6"|"$7"|"$10"|"$11"|"$14"|"$15"|"$16}'
echo "prefill bench: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 2>&1 | tee $OUT/run171-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
