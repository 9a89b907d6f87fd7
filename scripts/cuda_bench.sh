#!/usr/bin/env bash
# scripts/cuda_bench.sh BUILD_DIR [OUT_DIR] — on the GPU machine: the PyTorch fp16 peer, then
# our kernels (bench_decode_cuda reads the peer's numbers and prints one table with ratios).
# With --prefill among the bench's arguments: the prefill table and the prefill peer. --flush
# clean|dirty|none and --guard-us N go to both (the default: clean, a 256 MB read before each
# timed run, no spin).
# Needs a build with -DVQ_CUDA=ON (and -DVQ_CUDA_ALL_CONFIGS=ON for every configuration).
set -euo pipefail
build=${1:?usage: scripts/cuda_bench.sh BUILD_DIR [OUT_DIR]}
out=${2:-$build}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
peer_args=()
prev=
for a in "${@:3}"; do
  [[ $a == --prefill ]] && peer_args+=(--prefill)       # the prefill table and its peer
  [[ $a == --plain ]] && peer_args+=(--plain)           # the head_dim 96/80 table and its peer
  [[ $prev == --flush ]] && peer_args+=(--flush "$a")   # the peer flushes L2 as our rows do
  [[ $prev == --guard-us ]] && peer_args+=(--guard-us "$a")
  [[ $a == --noflush ]] && peer_args+=(--flush none)
  prev=$a
done
PYTHONUNBUFFERED=1 python3 "$here/bench/cuda/peer_sdpa.py" "${peer_args[@]}" --out "$out/peer.txt" | tee "$out/peer.log" || \
  echo "peer benchmark failed: ratios will be missing"
"$build/bench/bench_decode_cuda" --peer "$out/peer.txt" "${@:3}" | tee "$out/bench_decode_cuda.log"
