#!/usr/bin/env python3
# open_probe.py ROOT LISTING SECONDS: opens the first 2,000 files LISTING names (relative to ROOT)
# over and over for SECONDS; prints how many opens and their latency's median, p99, p99.9 and
# max in ms. (bench_node_status.sh)
import os, sys, time
root, listing, duration = sys.argv[1], sys.argv[2], float(sys.argv[3])
names = [l.strip() for l in open(listing)][:2000]
lat = []
end = time.time() + duration
i = 0
while time.time() < end:
    p = os.path.join(root, names[i % len(names)]); i += 1
    t = time.perf_counter(); fd = os.open(p, os.O_RDONLY); lat.append(time.perf_counter() - t); os.close(fd)
lat.sort()
q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] * 1000
print(f"opens {len(lat)} median {q(0.5):.3f} ms p99 {q(0.99):.3f} ms p99.9 {q(0.999):.3f} ms max {lat[-1]*1000:.1f} ms")
