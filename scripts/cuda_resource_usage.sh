#!/usr/bin/env bash
# scripts/cuda_resource_usage.sh [SOURCE.cu ...] — registers and spills of every attention/encode
# kernel instantiation, as ptxas reports them for sm_90 (no GPU needed; ~1 min per file on 2
# cores). Default: the attention instantiations of the default build and the encoder.
# Why: a change anywhere in vq_attn_kernel can move ptxas's allocation of the whole kernel, and
# a 512-thread instantiation (128-register cap) that starts or stops spilling gains or loses
# 3-5% in its streaming loop (docs/cuda-notes.md, run 43). Compare this table before and after
# a kernel change.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-nvcc}
command -v "$nvcc" >/dev/null || { echo "cuda_resource_usage: nvcc not found" >&2; exit 1; }
files=("$@")
[ ${#files[@]} -gt 0 ] || files=("$here"/src/cuda/attn_k4b8_v4b8.cu "$here"/src/cuda/attn_k4b12_v8b8.cu "$here"/src/cuda/encode.cu)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "vq_attn_kernel <head_dim, key sub_dim, key bits, value sub_dim, value bits, row tiles, k-tiles per warp tile,"
echo "                blocks/SM asked, warps, ring stages, codebook format 0 fp16 / 1 e4m3 / 2 int8 keys / 3 int8 keys+values>"
printf '%-60s %5s %12s %12s\n' "kernel <template arguments>" regs "spill st (B)" "spill ld (B)"
for f in "${files[@]}"; do
  "$nvcc" -I"$here/include" -I"$here/src" -O3 -DNDEBUG --generate-code=arch=compute_90,code=sm_90 \
    --expt-relaxed-constexpr -std=c++20 --resource-usage -c "$f" -o "$tmp/o.o" > "$tmp/log.txt" 2>&1 || {
    cat "$tmp/log.txt" >&2
    exit 1
  }
  python3 - "$tmp/log.txt" <<'PY'
import re, sys
for blk in open(sys.argv[1]).read().split('ptxas info    : Function properties for ')[1:]:
    name = blk.split('\n')[0].strip()
    m = re.search(r'(vq_\w+?)I((?:L[ib]\d+E)+)', name)
    sp = re.search(r'(\d+) bytes spill stores, (\d+) bytes spill loads', blk)
    rg = re.search(r'Used (\d+) registers', blk)
    if not (m and sp and rg):
        continue
    args = ','.join(re.findall(r'L[ib](\d+)E', m.group(2)))
    print(f"{m.group(1) + ' <' + args + '>':<60} {rg.group(1):>5} {sp.group(1):>12} {sp.group(2):>12}")
PY
done
