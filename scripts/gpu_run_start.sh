# scripts/gpu_run_start.sh RUN [--no-peer] — the common start of a device run script
# (docs/cuda-runs/runN-*.sh), sourced on the GPU machine from the repository root with .gpu-bundle
# carried: builds or unpacks the programs (gpu_prepare.sh: T, B), prints the GPU and its clocks,
# sets t0, and (without --no-peer) measures the decode peer (bench/cuda/peer_sdpa.py) into
# $OUT/b/peer.txt, its log $OUT/RUN-peer.log.
set -uo pipefail
source scripts/gpu_prepare.sh
[[ -n $T ]] || { echo "no test program"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
mkdir -p $OUT/b
if [[ ${2:-} != --no-peer ]]; then
  PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/$1-peer.log 2>&1 || echo "peer failed"
  grep PEER $OUT/$1-peer.log
fi
