#!/usr/bin/env python3
"""Where the daemons' threads wait in the kernel: samples every thread of every running
`dyadfs mount` process (any build's binary; or those whose command line holds MATCH) about a thousand times a
second for SECONDS, and prints the kernel stacks of the threads found blocked (state D) or
runnable (R), most frequent first, with how long each thread was seen in each (a stall shows as
one stack held for tens of samples in a row). With --json FILE, every sample goes there too
(time, pid, tid, thread name, state, stack) to line up with a daemon's `--trace`.
Run it beside a benchmark, as root (kernel stacks are root's): this is how the hand-off's 1% of
15-30 ms lookups were found waiting in `synchronize_rcu <- expand_files <- alloc_fd` (the
descriptor table growing; BENCHMARKS.md, the hand-off).
Usage: scripts/sample_stacks.py SECONDS [--match TEXT] [--json FILE] [--top N]"""
import argparse
import collections
import glob
import json
import os
import time


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def is_daemon(argv, match):
    """A `dyadfs mount` daemon (any build's binary), or a command line holding `match`."""
    if match:
        return match in " ".join(argv)
    return len(argv) > 1 and os.path.basename(argv[0]).startswith("dyadfs") and argv[1] == "mount"


def threads(match):
    """(pid, tid) of every thread of the processes sampled."""
    out = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        pid = cmdline.split("/")[2]
        if is_daemon(read(cmdline).split("\0"), match):
            try:
                out += [(pid, tid) for tid in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                pass
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("seconds", type=float)
    p.add_argument("--match", default="")
    p.add_argument("--json")
    p.add_argument("--top", type=int, default=8)
    a = p.parse_args()
    end = time.time() + a.seconds
    samples, found, listed = [], [], 0.0
    while time.time() < end:
        now = time.time()
        if now - listed > 0.1:
            found, listed = threads(a.match), now
        for pid, tid in found:
            stat = read(f"/proc/{pid}/task/{tid}/stat")
            if not stat:
                continue
            state = stat[stat.rfind(")") + 2]
            if state not in "DR":
                continue
            name = stat[stat.find("(") + 1 : stat.rfind(")")]
            stack = read(f"/proc/{pid}/task/{tid}/stack").strip()
            samples.append((now, pid, tid, name, state, stack))
        time.sleep(0.0005)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(samples, f)
    # Per (state, stack): samples, and the longest run of consecutive sightings of one thread.
    count = collections.Counter()
    longest = collections.defaultdict(float)
    runs = {}
    for t, pid, tid, _, state, stack in samples:
        key = (state, stack)
        count[key] += 1
        start, last = runs.get((tid, key), (t, t))
        if t - last > 0.005:
            start = t
        runs[(tid, key)] = (start, t)
        longest[key] = max(longest[key], t - start)
    print(f"{len(samples)} samples of blocked or runnable threads in {a.seconds:.0f} s")
    for (state, stack), n in count.most_common(a.top):
        frames = " <- ".join(line.split("] ", 1)[-1].split("+")[0] for line in stack.splitlines())
        print(f"{n:7d}  {state}  longest {longest[(state, stack)] * 1000:6.1f} ms  {frames or '-'}")


if __name__ == "__main__":
    main()
