#!/usr/bin/env bash
# Listing benchmark, interleaved run by run: `find -type f` over a tree and three scans of one
# wide directory (below), cold (page cache dropped before each), on the backing directory and
# through a mount of each binary in BINS (A/B of two builds; default: this tree's release
# build). The tree is one scripts/bench_scale.sh generated and kept:
#   KEEP=1 scripts/bench_scale.sh /var/tmp/scale1m      # once: 1M files + wide/ (100,000)
#   BINS="/tmp/dyadfs-old target/release/dyadfs" scripts/bench_listing.sh /var/tmp/scale1m
# Prints every run, then per configuration the median of its per-run ratios to the backing
# directory with their spread. Needs root. Env: RUNS (2), BINS.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
W=$(realpath "${1:?usage: bench_listing.sh WORKDIR-of-bench_scale}")
[ -d "$W/backing/wide" ] || { echo "no $W/backing/wide: run KEEP=1 scripts/bench_scale.sh $W" >&2; exit 1; }
RUNS=${RUNS:-2}
if [ -z "${BINS:-}" ]; then
  cargo build --release --quiet
  BINS=$PWD/target/release/dyadfs
fi
SSD=$(mktemp -d /var/tmp/dyadfs-listing-ssd.XXXX)
cleanup() { unmount_mounted "$W/mnt"; rm -rf "$SSD" "$SSD.log"; }
trap cleanup EXIT
secs() { local a; a=$(now); "$@" > /dev/null; echo "$(now) - $a" | bc; }
# Three scans of the wide directory: names and types only (how os.walk and torchvision's
# ImageFolder list), a stat of each entry as it is listed (`for e in os.scandir(d): e.stat()`),
# and every entry listed before any is stat'ed (ls -l, du).
scan() { python3 -c 'import os, sys; [e.is_file() for e in os.scandir(sys.argv[1])]' "$1"; }
scanstat() { python3 -c 'import os, sys; [e.stat() for e in os.scandir(sys.argv[1])]' "$1"; }
liststat() { python3 -c 'import os, sys; [e.stat() for e in list(os.scandir(sys.argv[1]))]' "$1"; }
SCANS="scandir scandir+stat list+stat"
scan_of() { case $1 in scandir) echo scan ;; scandir+stat) echo scanstat ;; *) echo liststat ;; esac; }
OUT=$(mktemp)
for run in $(seq "$RUNS"); do
  drop; echo "run $run backing find $(secs find "$W/backing" -type f)" | tee -a "$OUT"
  for sc in $SCANS; do
    drop; echo "run $run backing $sc $(secs "$(scan_of "$sc")" "$W/backing/wide")" | tee -a "$OUT"
  done
  for b in $BINS; do
    rm -rf "${SSD:?}"/*
    "$b" mount "$W/mnt" --ssd "$SSD" --backing "$W/backing" --log-file "$SSD.log"
    drop; echo "run $run $b find $(secs find "$W/mnt" -type f)" | tee -a "$OUT"
    for sc in $SCANS; do
      drop; echo "run $run $b $sc $(secs "$(scan_of "$sc")" "$W/mnt/wide")" | tee -a "$OUT"
    done
    fusermount3 -u "$W/mnt"; sleep 1
  done
done
# Per-run ratios to the backing directory of the same run: median, and the spread.
python3 - "$OUT" <<'PY'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    _, run, who, what, secs = line.split()
    t[(int(run), who, what)] = float(secs)
for what in ("find", "scandir", "scandir+stat", "list+stat"):
    for who in sorted({w for (_, w, x) in t if x == what and w != "backing"}):
        r = [t[(n, w, x)] / t[(n, "backing", x)] for (n, w, x) in t if w == who and x == what]
        print(f"{what:13} {who}: median {statistics.median(r):.2f}x the backing dir "
              f"(runs {min(r):.2f}-{max(r):.2f}, n={len(r)})")
PY
rm -f "$OUT"
