#!/usr/bin/env bash
# A node service restarted with many millions of small files cached (issue 72's 14 M files per
# node). A sample of SAMPLE real files (1-4 KiB) is read through a mount the service serves, then
# the service is stopped and the `node_cache_fill` example fills the same dataset's cache with
# the files SAMPLE..N through the cache's own fill path (packed segments and the header log as
# a fill writes them; reading N files through FUSE first would take hours). Then the service is
# started RUNS times, the page cache dropped before each: how long until it answers (every
# dataset's cache loaded), its RSS then and its peak, each run printed, and the median. Last, the
# sample is read through a new mount: every file a local hit, 0 bytes from the shared FS.
# Needs root and about 4.1 KiB of disk per file (55 GiB for 14 M) under WORKDIR.
# Usage: scripts/bench_node_restart.sh [WORKDIR]
# Env: N (14000000), DIRS (1000), SAMPLE (10000), RUNS (3), CAPACITY (the service's --capacity,
#      in bytes: 4 KiB a file), KEEP (keep WORKDIR and reuse its filled cache), DYADFS_BIN and
#      FILL_BIN (builds to measure and to fill with; a BINS="A B" list of builds is measured
#      run by run in turn).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
N=${N:-14000000} DIRS=${DIRS:-1000} SAMPLE=${SAMPLE:-10000} RUNS=${RUNS:-3}
CAPACITY=${CAPACITY:-$((N * 4096))}
build_dyadfs
[ -n "${FILL_BIN:-}" ] || build_examples node_cache_fill
FILL_BIN=${FILL_BIN:-$PWD/target/release/examples/node_cache_fill}
W=${1:-$(mktemp -d /var/tmp/dyadfs-node-restart.XXXX)}
mkdir -p "$W"/{shared,mnt}
service=
cleanup() {
  set +e
  unmount_mounted "$W/mnt"
  [ -z "$service" ] || { kill "$service"; wait "$service"; } 2> /dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT

# start: starts the service and waits until it answers; the seconds that took in $W/start.t
# (called in this shell, never in $(...): the service would hold the substitution's pipe).
start() {
  "$BIN" node serve --ssd "$W/node" --socket "$W/node.sock" --capacity "$CAPACITY" \
    > /dev/null 2>> "$W/node.log" &
  service=$!
  local t0
  t0=$(now)
  until "$BIN" node status --socket "$W/node.sock" > /dev/null 2>&1; do sleep 0.02; done
  printf '%.3f\n' "$(echo "$(now) - $t0" | bc -l)" > "$W/start.t"
}
stop() { kill "$service"; wait "$service" || true; service=; }
status_of() { awk "/$1/ {printf \"%.1f\", \$2 / 1024}" /proc/"$service"/status; }
stat_of() {
  "$BIN" node status --socket "$W/node.sock" --json |
    python3 -c "import json,sys; print(json.load(sys.stdin)['datasets'][0]['$1'])"
}
mount_it() {
  "$BIN" mount "$W/mnt" --ssd "$W/unused" --backing "$W/shared" --node-socket "$W/node.sock" \
    2> /dev/null
}
read_sample() { (cd "$W/mnt" && xargs -P4 -n 256 cat < "$W/sample" > /dev/null); }

if [ ! -f "$W/.filled" ]; then
  echo "writing a sample of $SAMPLE files and reading it through the service" >&2
  python3 - "$W/shared" "$SAMPLE" "$DIRS" <<'PY'
import os, random, sys
root, n, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(1)
blob = os.urandom(4096)
for d in range(min(n, dirs)):
    os.makedirs(os.path.join(root, f"d{d}"), exist_ok=True)
for i in range(n):
    with open(os.path.join(root, f"d{i % dirs}", f"{i}.bin"), "wb") as f:
        f.write(blob[: rnd.randint(1024, 4096)])
PY
  (cd "$W/shared" && find . -name '*.bin') > "$W/sample"
  start
  mount_it
  read_sample
  fusermount3 -u "$W/mnt"
  stop
  cache=$(find "$W/node/datasets" -mindepth 1 -maxdepth 1 -type d)
  echo "filling the dataset's cache with files $SAMPLE..$N" >&2
  "$FILL_BIN" "$cache" "$SAMPLE" "$N" "$DIRS" "$CAPACITY"
  touch "$W/.filled"
fi

echo "the node's cache: $(du -sh "$W/node" | cut -f1), its header log" \
  "$(du -sh "$W"/node/datasets/*/index.log | cut -f1)"
read -ra builds <<< "${BINS:-$BIN}"
for run in $(seq "$RUNS"); do
  for b in "${!builds[@]}"; do
    BIN=${builds[$b]}
    drop
    start
    t=$(cat "$W/start.t")
    echo "$t" >> "$W/starts.$b"
    echo "run $run, build $b: $t s until the service answers, RSS $(status_of VmRSS) MiB" \
      "(peak $(status_of VmHWM) MiB), $(stat_of cached_files) files cached"
    stop
  done
done
for b in "${!builds[@]}"; do
  echo "build $b (${builds[$b]}): restart, median of $RUNS: $(tail -n "$RUNS" "$W/starts.$b" |
    sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') s (range $(tail -n "$RUNS" \
    "$W/starts.$b" | sort -n | sed -n '1p;$p' | paste -sd-) s)"
done

start
mount_it
drop
t0=$(now)
read_sample
t1=$(now)
echo "the sample of $SAMPLE after the restarts: $(printf '%.3f' "$(echo "$t1 - $t0" | bc -l)") s," \
  "$(stat_of local_hits) local hits, $(stat_of bytes_from_backing) bytes from the shared FS"
fusermount3 -u "$W/mnt"
