#!/usr/bin/env python3
"""scripts/ncu_phases.py SOURCE_PAGE.csv — where an attention kernel's warps stall, per phase.

Groups Nsight Compute's per-SASS-instruction source page by the code between the kernel's
clock stamps (the `CS2R ... SR_CLOCKLO` of `--profile`'s phase stamps, in program order:
region 1 = setup, 2 = coded loop, 3 = window, 5 = combine, ...; rarely run blocks the compiler
moved to the end of the kernel land in the last regions) and prints, per region, the stall
samples by reason and the hottest instructions. On the GPU machine (run 58):

  ncu --kernel-name regex:vq_attn_kernel --launch-skip 3 --launch-count 1 \
      --section WarpStateStats --section SourceCounters -o rep \
      build/bench/bench_decode_cuda --skip-encode --skip-step --filter d4b8/d4b8 --shape 1x131072 --reps 1
  ncu -i rep.ncu-rep --page source --csv --print-source sass > src.csv
  python3 scripts/ncu_phases.py src.csv
"""
import csv, sys, re, collections
rows = list(csv.reader(open(sys.argv[1], newline='', errors='replace')))
hi = next(i for i, r in enumerate(rows) if any('Source' == c.strip() for c in r))
hdr = [c.strip() for c in rows[hi]]
print("columns:", hdr)
data = rows[hi + 1:]
src = hdr.index('Source')
num_cols = [i for i, h in enumerate(hdr) if re.search(r'[Ss]ampl|stall|Instructions Executed', h)]
def val(r, i):
    try: return float(r[i].replace(',', ''))
    except: return 0.0
phase, acc = 0, collections.defaultdict(lambda: collections.defaultdict(float))
hot = collections.defaultdict(list)
for r in data:
    if len(r) <= src: continue
    s = r[src]
    if 'SR_CLOCKLO' in s: phase += 1
    for i in num_cols: acc[phase][hdr[i]] += val(r, i)
    hot[phase].append((val(r, num_cols[0]) if num_cols else 0, s, [r[i] for i in num_cols]))
for ph in sorted(acc):
    print(f"== region {ph} (after {ph} clock reads)")
    for k, v in acc[ph].items():
        if v: print(f"   {k}: {v:.0f}")
    for sc, s, vals in sorted(hot[ph], key=lambda x: -x[0])[:8]:
        print(f"     {sc:8.0f}  {s[:70]:70s} {vals[:6]}")
