#!/usr/bin/env python3
"""scripts/ncu_summary.py CSV — one line per (kernel, grid) of an `ncu --csv --metrics ...` log:
launches, and the median of each metric over them; with dram__bytes_write.sum and
gpu__time_duration.sum also the write bandwidth (GB/s). Lines before the CSV header (the
profiled program's own output) are skipped."""
import csv
import statistics
import sys
from collections import defaultdict


def main(path):
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print("no ncu CSV in", path)
        return 1
    rows = list(csv.DictReader(lines[start:]))
    per = defaultdict(lambda: defaultdict(dict))  # (kernel, grid) -> launch id -> metric -> value
    units = {}
    for r in rows:
        name = r["Kernel Name"].split("(")[0]
        key = (name, r["Grid Size"])
        try:
            v = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        per[key][r["ID"]][r["Metric Name"]] = v
        units[r["Metric Name"]] = r["Metric Unit"]
    metrics = sorted(units)
    print("kernel | grid | launches | " + " | ".join(f"{m} ({units[m]})" for m in metrics) + " | write GB/s")
    for (name, grid), launches in sorted(per.items()):
        med = {m: statistics.median(l[m] for l in launches.values() if m in l) for m in metrics
               if any(m in l for l in launches.values())}
        gbps = "-"
        t, w = med.get("gpu__time_duration.sum"), med.get("dram__bytes_write.sum")
        if t and w:
            ts = t * {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}.get(units["gpu__time_duration.sum"], 1e-9)
            wb = w * {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(units["dram__bytes_write.sum"], 1)
            gbps = f"{wb / ts / 1e9:.0f}"
        print(f"{name} | {grid} | {len(launches)} | " + " | ".join(f"{med.get(m, float('nan')):.4g}" for m in metrics) + f" | {gbps}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
