"""Turns scripts/workload.sh's results (one JSON object per epoch) into a Markdown table and a
PNG of epoch time per configuration.

Usage: python3 report.py RESULTS.jsonl OUTDIR "COMMAND" "WHAT RAN IT"
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CONFIGS = ["shared", "local", "dyadfs", "nocopy", "replicate", "prefetch"]
LABELS = {"shared": "(a) shared FS directly", "local": "(b) local copy directly",
          "dyadfs": "(c) dyadfs", "nocopy": "(f) dyadfs --replicate off",
          "replicate": "(d) dyadfs --replicate on",
          "prefetch": "(e) dyadfs + prefetch hint"}
CLUSTER = ("dyadfs", "nocopy", "replicate", "prefetch")


def mib(b):
    return f"{b / 2**20:.0f}"


def main():
    path, out, command, machine = sys.argv[1:5]
    lines = [json.loads(line) for line in open(path)]
    rows = [r for r in lines if "workload" in r]
    throttle = [r for r in lines if "throttle_check" in r]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    get = {(r["workload"], r["config"], r["epoch"]): r for r in rows}
    lines = [f"Command: `{command}` ({machine})", ""]
    if throttle:
        lines += ["Throttle check (200 MiB read from the shared FS by a process of the cgroup, page "
                  "cache dropped first): " + ", ".join(f"{r['throttle_check']} {r['mib_per_s']} MiB/s"
                                                       for r in throttle), ""]
    for w in workloads:
        has_au = any("au_percent" in r for r in rows if r["workload"] == w)
        lines += [f"### {w}", "",
                  "| config | epoch | seconds | samples/s |" + (" AU % |" if has_au else "")
                  + " CPU busy % | other CPU s | local opens | MiB from peers (replicated) |"
                  " MiB from shared FS | daemon CPU s |",
                  "|---|---|---|---|" + ("---|" if has_au else "") + "---|---|---|---|---|---|"]
        for c in [c for c in CONFIGS if any(r["config"] == c for r in rows)]:
            for r in sorted((r for r in rows if r["workload"] == w and r["config"] == c),
                            key=lambda r: r["epoch"]):
                src = ["", "", "", ""]
                if c in CLUSTER:
                    peer = mib(r["peer"])
                    if r.get("replicated"):
                        peer += f" ({mib(r['replicated'])})"
                    src = [str(r["local_hits"]), peer, mib(r["backing"]),
                           f"{r['daemon_cpu_s']:.1f}"]
                au = [f"{r['au_percent']:.1f}"] if has_au else []
                lines.append("| " + " | ".join([LABELS[c], str(r["epoch"]), f"{r['seconds']:.2f}",
                                                 f"{r['samples_per_s']:.1f}"] + au
                                                + [f"{r['cpu_busy_percent']:.0f}",
                                                   f"{r.get('other_cpu_s', float('nan')):.1f}"]
                                                + src) + " |")
        epochs = sorted({r["epoch"] for r in rows if r["workload"] == w})
        checks = []
        for c in CLUSTER:
            e1 = (get.get((w, c, 1)), get.get((w, "shared", 1)))
            if all(e1):
                checks.append(f"epoch 1: {LABELS[c][4:]} / shared FS = "
                              f"{e1[0]['seconds'] / e1[1]['seconds']:.2f} (target <= 1.05)")
            for e in epochs[1:]:
                d, l = get.get((w, c, e)), get.get((w, "local", e))
                if d and l:
                    checks.append(f"epoch {e}: {LABELS[c][4:]} / local copy = "
                                  f"{d['seconds'] / l['seconds']:.2f} (target <= 1.1)")
        during = {r.get("cpu_busy_during", "run") for r in rows if r["workload"] == w}
        lines += [""] + [c + "  " for c in checks] + ["",
                  "CPU busy: all CPUs of the machine, "
                  + ("during the epoch" if during == {"epoch"} else
                     "during the whole run of the epoch's processes (start-up included)")
                  + ". other CPU: CPU time of processes outside the run and of kernel threads "
                  "while the epoch's processes ran (another job on the machine shows here)"
                  ". local opens: opens of a complete copy in the node's cache. daemon CPU: "
                  "user + system time of the 4 daemons during the epoch. (replicated): the part of "
                  "the bytes from peers that --replicate copied in the background.", ""]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")

    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        epochs = sorted({r["epoch"] for r in rows if r["workload"] == w})
        ran = [c for c in CONFIGS if any(r["config"] == c for r in rows if r["workload"] == w)]
        width = 0.8 / len(ran)
        for k, c in enumerate(ran):
            xs = [e + (k - (len(ran) - 1) / 2) * width for e in epochs]
            ys = [get[(w, c, e)]["seconds"] if (w, c, e) in get else 0 for e in epochs]
            ax.bar(xs, ys, width, label=LABELS[c])
        ax.set_title(w)
        ax.set_xlabel("epoch")
        ax.set_ylabel("epoch time (s)")
        ax.set_xticks(epochs)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "epochs.png"), dpi=100)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
