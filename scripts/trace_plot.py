#!/usr/bin/env python3
"""Turns a `dyadfs mount --trace` file into an SVG timeline (one lane per node and thread,
one box per operation, coloured by kind) and prints per-kind latency percentiles.
Several nodes' traces line up (their times are since the Unix epoch). Standard library only.
Usage: scripts/trace_plot.py OUT.svg TRACE.json [TRACE.json...]"""
import json
import sys

COLOURS = {"fill": "#d62728", "pull": "#1f77b4", "locate": "#2ca02c", "lookup": "#17becf", "open": "#ff7f0e",
           "read": "#9467bd", "getattr": "#8c564b", "create": "#e377c2", "write": "#7f7f7f"}


def load(path):
    text = open(path).read().rstrip().rstrip(",")
    if not text.endswith("]"):
        text += "]"
    return json.loads(text)


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main(out, traces):
    ev = [e for t in traces for e in load(t) if e.get("ph") == "X"]
    if not ev:
        sys.exit("no events in " + " ".join(traces))
    lanes = sorted({(e["pid"], e["tid"]) for e in ev})
    t0 = min(e["ts"] for e in ev)
    t1 = max(e["ts"] + e["dur"] for e in ev)
    width, lane_h, left = 1200, 14, 150
    scale = (width - left - 10) / max(t1 - t0, 1)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{len(lanes) * lane_h + 40}" font-family="sans-serif" font-size="10">']
    for i, (pid, tid) in enumerate(lanes):
        svg.append(f'<text x="2" y="{i * lane_h + 11}">node {pid} thread {tid}</text>')
    for e in ev:
        i = lanes.index((e["pid"], e["tid"]))
        x = left + (e["ts"] - t0) * scale
        w = max(e["dur"] * scale, 0.5)
        c = COLOURS.get(e["name"], "#bcbd22")
        svg.append(f'<rect x="{x:.1f}" y="{i * lane_h + 2}" width="{w:.1f}" height="{lane_h - 4}" '
                   f'fill="{c}"><title>{e["name"]} {e["dur"]:.0f} us {e.get("args", {})}</title>'
                   '</rect>')
    y = len(lanes) * lane_h + 25
    for k, (name, c) in enumerate(COLOURS.items()):
        svg.append(f'<rect x="{left + k * 90}" y="{y - 9}" width="10" height="10" fill="{c}"/>'
                   f'<text x="{left + k * 90 + 14}" y="{y}">{name}</text>')
    svg.append(f'<text x="2" y="{y}">{(t1 - t0) / 1000:.1f} ms</text></svg>')
    open(out, "w").write("\n".join(svg))
    kinds = {}
    for e in ev:
        key = e["name"] + (":" + e["args"]["source"] if "source" in e.get("args", {}) else "")
        kinds.setdefault(key, []).append(e["dur"])
    print(f"{'operation':<18} {'count':>7} {'p50 us':>9} {'p99 us':>9}")
    for k, d in sorted(kinds.items()):
        print(f"{k:<18} {len(d):>7} {percentile(d, 50):>9.0f} {percentile(d, 99):>9.0f}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
