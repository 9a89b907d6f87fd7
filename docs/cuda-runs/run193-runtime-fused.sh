#!/usr/bin/env bash
# Run 193 (twenty-second session, 2026-12-07): the runtime's small ops fused around its products
# (src/cuda/runtime_decoder.cu: residual add + RMSNorm + rounding in one kernel, q/k/v and gate/up
# stacked into one product each, biases + q/k norms + RoPE in one kernel, SwiGLU writing the down
# product's rounded input), against the tree before it (8f37006's bench_runtime_decode, carried as
# .gpu-base/bench_runtime_decode.base.xz) in the same call, and Hugging Face transformers at the
# same shapes (bench/cuda/peer_runtime_hf.py). From the repository root with .gpu-bundle and
# .gpu-base carried:
#   bash docs/cuda-runs/run193-runtime-fused.sh run193 a   the runtime's CUDA tests, then the runtime
#        bench (tree before / this tree, eager and graph in each) and the HF peer       (~5 min)
#   bash docs/cuda-runs/run193-runtime-fused.sh run193 b   every other CUDA test              (~5 min)
#   bash docs/cuda-runs/run193-runtime-fused.sh run193 c   (an H200) the peer and issue 4's head_dim
#        128 decode table (d4b8 and the defaults, int8 keys), then every other CUDA test (~9 min)
M=${2:?a, b or c}
if [[ $M == c ]]; then
  source scripts/gpu_run_start.sh "$1"
  R=$1-$M
  $B --peer $OUT/b/peer.txt --filter +i8 --reps 20 --skip-step > $OUT/$R-table.log 2>&1
  grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8 \||encode keys d4b8 grid |held|FAILED" $OUT/$R-table.log | head -30
  echo "table: $(( $(date +%s) - t0 )) s"
  M=b
else
  source scripts/gpu_run_start.sh "$1" --no-peer
fi
R=$1-$M
if [[ $M == a ]]; then
  $T --gtest_brief=1 --gtest_filter='*CudaRuntime*' > $OUT/$R-tests.log 2>&1
  grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|cuda forward graphs|mixed" $OUT/$R-tests.log | head -40
  echo "tests: $(( $(date +%s) - t0 )) s"
  [[ -n $RD ]] || { echo "no bench_runtime_decode"; exit 1; }
  python3 -c "import lzma,sys; open('/tmp/rd_base','wb').write(lzma.open(sys.argv[1]).read())" \
    .gpu-base/bench_runtime_decode.base.xz && chmod +x /tmp/rd_base || echo "no base binary"
  for p in "tiny --ctx 1024" "qwen0.5b --ctx 4096" "llama8b-2l --ctx 4096"; do
    n=${p%% *}
    if [[ $n != llama8b-2l && -x /tmp/rd_base ]]; then
      /tmp/rd_base --preset $p --steps 128 --reps 3 > $OUT/$R-runtime-$n-base.log 2>&1
      echo "== $n, the tree before (8f37006)"; grep "^|" $OUT/$R-runtime-$n-base.log
    fi
    $RD --preset $p --steps 128 --reps 3 > $OUT/$R-runtime-$n.log 2>&1
    echo "== $n, this tree"; grep -E "^\||FAILED" $OUT/$R-runtime-$n.log
    echo "runtime $n: $(( $(date +%s) - t0 )) s"
  done
  for p in "qwen0.5b --ctx 4096" "llama8b-2l --ctx 4096"; do
    PYTHONUNBUFFERED=1 timeout 150 python3 bench/cuda/peer_runtime_hf.py --preset $p --steps 128 --reps 3 \
      > $OUT/$R-peer-hf-${p%% *}.log 2>&1 || echo "hf peer ${p%% *}: rc $?"
    grep PEERRT $OUT/$R-peer-hf-${p%% *}.log; tail -3 $OUT/$R-peer-hf-${p%% *}.log | grep -v PEERRT
    echo "hf ${p%% *}: $(( $(date +%s) - t0 )) s"
  done
  exit 0
fi
$T --gtest_brief=1 --gtest_filter='-*CudaRuntime*' > $OUT/$R-tests.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped" $OUT/$R-tests.log | head -60
echo "tests: $(( $(date +%s) - t0 )) s"
