#!/usr/bin/env python3
"""Where slow hand-offs spend their time: reads what `TRACE_DIR=DIR scripts/bench_handoff.sh`
kept (each run's daemon traces and the producers' and consumers' timings) and prints, per run,
the spans' p50 / p99 / max by name and node, then the slowest 1% of producer closes, each with
the daemon spans inside it (the FLUSH, the seal, the publish, the mappings' check) and the
time outside them (the kernel's queue before the FLUSH, the WRITE before it), then the same
for the slowest 1% of wake-ups (close return -> consumer's open return).
Usage: scripts/handoff_tail.py DIR"""
import glob
import json
import os
import sys


def load(path):
    text = open(path).read().rstrip().rstrip(",")
    if not text.endswith("]"):
        text += "]"
    return json.loads(text)


def q(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))] if xs else 0.0


def label(e):
    """A span's name, with the message kind for a locator answer (`answer/NameSet`)."""
    return e["name"] + ("/" + e["args"].get("msg", "") if e["name"] == "answer" else "")


def inside(events, t0, t1, names):
    """The named spans that overlap [t0, t1] (seconds), as (label, node, start offset, dur) ms,
    less the waits a name home holds open (`answer/NameGet`: they overlap everything)."""
    out = []
    for e in events:
        s, d = e["ts"] / 1e6, e["dur"] / 1e6
        if e["name"] in names and s < t1 and s + d > t0 and label(e) != "answer/NameGet":
            out.append((label(e), e["pid"], 1000 * (s - t0), 1000 * d))
    return sorted(out, key=lambda x: x[2])


def spans_line(spans):
    return "  ".join(f"{s[0]}@{s[1]} +{s[2]:.2f} {s[3]:.2f}" for s in spans)


def report(run):
    events = []
    for f in sorted(glob.glob(os.path.join(run, "node*.json"))):
        events += [e for e in load(f) if e.get("ph") == "X"]
    by = {}
    for e in events:
        by.setdefault((label(e), e["pid"]), []).append(e["dur"] / 1000)
    print(f"== {run}: {len(events)} spans")
    print(f"  {'span':<22} {'node':>4} {'count':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for (name, node), ds in sorted(by.items()):
        if len(ds) >= 20:
            print(f"  {name:<22} {node:>4} {len(ds):>6} {q(ds, .5):8.3f} {q(ds, .99):8.3f} {max(ds):8.3f}")
    logs = {k: json.load(open(os.path.join(run, k))) for k in ("p0", "p1", "c0", "c1")}
    closes = [(p[1] - p[0], i, n, p) for n in (0, 1) for i, p in enumerate(logs[f"p{n}"])]
    closes.sort(reverse=True)
    worst = closes[: max(3, len(closes) // 100)]
    print(f"  slowest closes (producer n on node n): ms, then spans overlapping it (name node +start dur)")
    want = {"flush", "mappings", "seal", "publish", "answer", "create", "open", "lookup", "setattr",
            "caller", "resolve", "ask", "staged", "backing_stat", "remembered", "shared_stat"}
    for dur, i, n, p in worst:
        print(f"    p{n} file {i}: {1000 * dur:.2f} ms: " + spans_line(inside(events, p[0], p[1], want)))
    wakes = []
    for n in (0, 1):
        for i, (p, c) in enumerate(zip(logs[f"p{n}"], logs[f"c{n}"])):
            wakes.append((c[1] - max(p[1], c[0]), i, n, p, c))
    wakes.sort(reverse=True)
    print("  slowest wake-ups (close return or open call -> open return)")
    for dur, i, n, p, c in wakes[: max(3, len(wakes) // 100)]:
        t0 = max(p[1], c[0])
        spans = inside(events, t0, c[1], want | {"locate", "pull", "getattr"})
        print(f"    f-{n}-{i}: {1000 * dur:.2f} ms: " + spans_line(spans[:12]))


def main():
    for run in sorted(glob.glob(os.path.join(sys.argv[1], "*-*"))):
        if os.path.isdir(run):
            report(run)


if __name__ == "__main__":
    main()
