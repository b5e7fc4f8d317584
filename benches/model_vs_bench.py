#!/usr/bin/env python3
"""The cost model against measurement (docs/algorithms.md, "The cost model"): for each rank
count and operation, `jaccl bench` over TCP on this machine and `jaccl plan --link here` at the
same sizes; prints the algorithm jaccl chose, the predicted and the measured time per call and
their ratio. The measured time is the best of RUNS benches (3 by default): on a machine whose
ranks outnumber its cores, one run in several is slowed at a size by something else.

Usage: benches/model_vs_bench.py target/release/jaccl "4 16 64" "all-reduce all-gather all-to-all" [CACHE_DIR [RUNS]]
(CACHE_DIR keeps the bench outputs, so the model can be refitted without measuring again)."""
import subprocess, sys, re, os
bin_, ns, ops = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
cache = sys.argv[4] if len(sys.argv) > 4 else None
runs = int(sys.argv[5]) if len(sys.argv) > 5 else 3
def sizes(op, n):
    lo = 64 if op == "all-reduce" else 64 * n
    return lo, 4 << 20
rows = []
for n in map(int, ns):
    for op in ops:
        lo, hi = sizes(op, n)
        key = f"{cache}/{op}-{n}-best-of-{runs}.txt" if cache else None
        if key and os.path.exists(key):
            out = open(key).read()
        else:
            out = "".join(subprocess.run([bin_, "bench", "-n", str(n), "--transport", "tcp",
                                          "--op", op, "-b", str(lo), "-e", str(hi), "-f", "8"],
                                         capture_output=True, text=True).stdout
                          for _ in range(runs))
            if key:
                os.makedirs(cache, exist_ok=True); open(key, "w").write(out)
        measured = {}
        for line in out.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            f = line.split()
            size, us = int(f[0]), float(f[4])
            measured[size] = min(us, measured.get(size, us))
        plan = subprocess.run([bin_, "plan", "--link", "here", "-n", str(n), "--op", op,
                               "-b", str(lo), "-e", str(hi), "-f", "8"],
                              capture_output=True, text=True).stdout
        for line in plan.splitlines():
            if "chosen" not in line or line.startswith("#"):
                continue
            m = re.match(r"\s*([\d.]+ \S+)\s+(.+?)\s{2,}\s*(\d+)\s+([\d.]+ \S+)\s+([\d.]+)", line)
            size_h, algo, rounds, _, us = m.groups()
            num, unit = size_h.split()
            size = int(float(num) * {"B": 1, "KiB": 1024, "MiB": 1 << 20}[unit])
            meas = measured.get(size)
            ratio = float(us) / meas if meas else float("nan")
            rows.append((n, op, size, algo, float(us), meas, ratio))
            print(f"{n:4d} {op:11s} {size:>9d} {algo:20s} model {float(us):10.1f} bench {meas!s:>10} ratio {ratio:5.2f}", flush=True)
