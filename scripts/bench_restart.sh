#!/usr/bin/env bash
# Warm restart over a kept cache, several builds interleaved run by run: each mounts the cache
# of a `KEEP=1 scripts/bench_scale.sh WORKDIR` run (a million cached samples by default), with
# the page cache dropped first; prints the time until the mount returned, the daemon's RSS and
# its peak RSS (VmHWM: loading's high-water mark), then unmounts. Medians of RUNS runs at the end.
# Needs root. Usage: scripts/bench_restart.sh WORKDIR BIN...   (env: RUNS, default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
[ "$(id -u)" -eq 0 ] || { echo "bench_restart.sh needs root (drop_caches)" >&2; exit 1; }
[ $# -ge 2 ] || { echo "usage: scripts/bench_restart.sh WORKDIR BIN..." >&2; exit 2; }
W=$(realpath "$1"); shift
[ -f "$W/ssd/index.log" ] || { echo "no kept cache in $W/ssd (run KEEP=1 scripts/bench_scale.sh $W)" >&2; exit 1; }
RUNS=${RUNS:-3}
trap 'unmount_mounted "$W/mnt"' EXIT
unmount_mounted "$W/mnt"
T=$(mktemp -d)
for r in $(seq "$RUNS"); do
  for i in "$@"; do
    drop
    t0=$(now)
    # The daemon inherits bench_scale's descriptor limit.
    (ulimit -n 1024; "$i" mount "$W/mnt" --ssd "$W/ssd" --backing "$W/backing")
    t=$(echo "$(now) - $t0" | bc -l)
    pid=$("$i" stats "$W/mnt" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])')
    rss=$(awk '/^VmRSS:/ {print $2 / 1024}' "/proc/$pid/status")
    hwm=$(awk '/^VmHWM:/ {print $2 / 1024}' "/proc/$pid/status")
    printf '%s run %d: mount %.2f s, RSS %.1f MiB, peak %.1f MiB\n' "$i" "$r" "$t" "$rss" "$hwm"
    k=$(echo "$i" | md5sum | cut -c1-8)
    echo "$t" >> "$T/t.$k"; echo "$hwm" >> "$T/hwm.$k"
    fusermount3 -u "$W/mnt"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  done
done
echo "medians of $RUNS runs:"
for i in "$@"; do
  k=$(echo "$i" | md5sum | cut -c1-8)
  printf '  %s: mount %.2f s, peak RSS %.1f MiB\n' "$i" "$(median < "$T/t.$k")" "$(median < "$T/hwm.$k")"
done
rm -rf "$T"
