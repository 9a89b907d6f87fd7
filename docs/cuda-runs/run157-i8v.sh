#!/usr/bin/env bash
# run 157: int8 value products on mma.sync (IMMA s8 x u8) in the four-row kernel with int8 keys
# and values (CodebookFormat::I8KV; run 156 costed it at -10% to +1% against i8's loop). All
# CUDA tests, then the d4b8 rows (i8 and i8kv) and the defaults with the peer in the same
# command, the d4b8 rows again, batch-1 profiles of both, and the SASS instruction mix of the two
# 16-warp four-row kernels. Here: nothing to prepare (the device builds from source); on the GPU
# machine, from the repository root, with .gpu-bundle carried: `bash docs/cuda-runs/run157-i8v.sh`.
set -uo pipefail
source scripts/gpu_prepare.sh
[[ -n $T ]] || { echo "no test program"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
mkdir -p $OUT/b
PYTHONUNBUFFERED=1 python3 bench/cuda/peer_sdpa.py --out $OUT/b/peer.txt > $OUT/run157-peer.log 2>&1 || echo "peer failed"
grep PEER $OUT/run157-peer.log
$B --peer $OUT/b/peer.txt --filter +i8 --reps 20 --skip-encode --skip-step > $OUT/run157-table.log 2>&1
grep -E "^device|HBM copy|^\| d4b(8|12)/d[48]b8\+i8(kv)? |FAILED" $OUT/run157-table.log | head -30
echo "table: $(( $(date +%s) - t0 )) s"
$B --peer $OUT/b/peer.txt --filter d4b8/d4b8+i8 --reps 20 --skip-encode --skip-step > $OUT/run157-ab2.log 2>&1
grep -E "^\| d4b8/d4b8\+i8|FAILED" $OUT/run157-ab2.log
for f in 'd4b8/d4b8+i8$' 'd4b8/d4b8+i8kv$'; do
  $B --filter "$f" --reps 10 --skip-encode --skip-step --profile --quick > $OUT/run157-profile-$(echo $f | tr -d '/$+').log 2>&1
done
grep -hE "^d4b8|setup|coded loop|window \(|combine|arrival|merge" $OUT/run157-profile-*.log | head -40
obj=build-gpu/CMakeFiles/veloxquant.dir/src/cuda/attn_k4b8_v4b8.cu.o
[[ -f $obj ]] && cuobjdump -sass $obj > $OUT/run157-k4b8.sass 2>/dev/null && python3 - $OUT/run157-k4b8.sass <<'PY'
import re, sys
cur, d = None, {}
for line in open(sys.argv[1]):
    m = re.search(r'Function : (\S+)', line)
    if m: cur = m.group(1); d[cur] = []; continue
    m = re.search(r'/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)', line)
    if m and cur: d[cur].append(m.group(1).split('.')[0])
for f, ins in d.items():
    if 'Li128ELi4ELi8ELi4ELi8ELi1ELi2ELi1ELi16ELi3ELi2ELi1E' in f or 'Li128ELi4ELi8ELi4ELi8ELi1ELi2ELi1ELi16ELi3ELi3ELi1E' in f:
        c = lambda op: sum(1 for i in ins if i == op)
        print('SASS', 'CBF3' if 'Li3ELi3ELi1E' in f else 'CBF2', 'total', len(ins),
              ' '.join(f'{op} {c(op)}' for op in ['LDS', 'PRMT', 'IMMA', 'HMMA', 'I2F', 'I2FP', 'F2FP', 'FFMA', 'MUFU']))
PY
echo "perf: $(( $(date +%s) - t0 )) s"
$T --gtest_brief=1 2>&1 | tee $OUT/run157-tests.log | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Skipped|four-row kernel\]|two-blocks kernels\]|cuda attention I8KV|cuda attention i8kv" | head -40
echo "total: $(( $(date +%s) - t0 )) s"
