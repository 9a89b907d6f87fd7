#!/usr/bin/env bash
# scripts/check_sm80.sh [SOURCE.cu ...] — compiles CUDA sources for sm_80 (Ampere) only, to keep
# the kernels building there: the library targets sm_90 (CMAKE_CUDA_ARCHITECTURES=90) and the
# sm_90-only paths (clusters, bulk L2 prefetch) must stay behind __CUDA_ARCH__ guards. No GPU
# needed. Default: the d4b8 attention instantiations (every codebook format, head_dim 64/128,
# one and two row tiles), the attention host code, the encoder, the prefill kernels and the plain
# kernel at head_dim 192 (the other head dims' files differ from it in D only). Skips with a
# message when nvcc is missing. All of src/cuda with every configuration: VQ_SM80_ALL=1 (~5 min on 2 cores).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-nvcc}
[ -x /usr/local/cuda/bin/nvcc ] && ! command -v "$nvcc" >/dev/null && nvcc=/usr/local/cuda/bin/nvcc
if ! command -v "$nvcc" >/dev/null; then
  echo "check_sm80: nvcc not found, skipped"
  exit 0
fi
files=("$@")
defs=()
if [ ${#files[@]} -eq 0 ]; then
  if [ "${VQ_SM80_ALL:-0}" = 1 ]; then
    files=("$here"/src/cuda/*.cu)
    defs=(-DVQ_CUDA_ALL_CONFIGS=1 -DVQ_CUDA_VARIANTS=1)
  else
    files=("$here"/src/cuda/attn_k4b8_v4b8.cu "$here"/src/cuda/attention.cu "$here"/src/cuda/encode.cu "$here"/src/cuda/prefill.cu "$here"/src/cuda/attn_any_hd192.cu)
  fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pids=()
for f in "${files[@]}"; do
  b=$(basename "$f" .cu)
  "$nvcc" -I"$here/include" -I"$here/src" -O3 -DNDEBUG --generate-code=arch=compute_80,code=sm_80 \
    --expt-relaxed-constexpr -std=c++20 "${defs[@]}" -c "$f" -o "$tmp/$b.o" > "$tmp/$b.log" 2>&1 &
  pids+=("$!:$b")
done
fail=0
for pb in "${pids[@]}"; do
  if wait "${pb%%:*}"; then echo "check_sm80: ${pb#*:}.cu ok"; else echo "check_sm80: ${pb#*:}.cu FAILED"; cat "$tmp/${pb#*:}.log"; fail=1; fi
done
exit $fail
