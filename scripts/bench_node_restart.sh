#!/usr/bin/env bash
# A node service restarted with many millions of small files cached (issue 72's 14 M files per
# node). A sample of SAMPLE real files (1-4 KiB) is read through a mount the service serves, then
# the service is stopped and the `node_cache_fill` example fills the same dataset's cache with
# the files SAMPLE..N through the cache's own fill path (packed segments and the header log as
# a fill writes them; reading N files through FUSE first would take hours). Then the service is
# started RUNS times, the page cache dropped before each: how long until it answers (every
# dataset's cache loaded), its RSS then and its peak, each run printed, and the median. Last, the
# sample is read through a new mount: every file a local hit, 0 bytes from the shared FS.
# SITE=1: the service is node 0 of a site of two (node 1 a service with an empty cache): each
# run (node 1 restarted before it, its tables empty) also prints how long until the cache's
# copies are all published to their homes again (the two services' global rows reaching the
# files cached) and the peak RSS by then.
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
status_of() { awk "/$1/ {printf \"%.1f\", \$2 / 1024}" /proc/"$service"/status; }
site_args=()
helper=
stop_helper() { [ -z "$helper" ] || { kill "$helper"; wait "$helper" || true; }; }
trap 'stop_helper; node_cleanup' EXIT
if [ -n "${SITE:-}" ]; then
  site_peers 2 2 > "$W/site.peers"
  [ -f "$W/site.key" ] || "$BIN" keygen "$W/site.key" > /dev/null
  site_args=(--site-peers "$W/site.peers" --site-key "$W/site.key" --data-plane stream)
fi
# start_helper: node 1 of the site, its tables empty.
start_helper() {
  stop_helper
  "$BIN" node serve --ssd "$W/helper" --socket "$W/helper.sock" "${site_args[@]}" --node-id 1 \
    > /dev/null 2>> "$W/helper.log" &
  helper=$!
  until "$BIN" node status --socket "$W/helper.sock" > /dev/null 2>&1; do sleep 0.02; done
}
rows() {
  "$BIN" node status --socket "$1" --json |
    python3 -c "import json,sys; print(json.load(sys.stdin)['site']['home_global_files'])"
}
# published T0: seconds from T0 until every cached file has its global home's row again.
published() {
  local files t0=$1
  files=$(node_stat cached_files)
  until [ $(($(rows "$W/node.sock") + $(rows "$W/helper.sock"))) -ge "$files" ]; do
    sleep 0.2
  done
  printf '%.1f' "$(echo "$(now) - $t0" | bc -l)"
}
read_sample() { (cd "$W/mnt" && xargs -P4 -n 256 cat < "$W/sample" > /dev/null); }

if [ ! -f "$W/.filled" ]; then
  echo "writing a sample of $SAMPLE files and reading it through the service" >&2
  small_files "$W/shared" "$SAMPLE" "$DIRS"
  (cd "$W/shared" && find . -name '*.bin') > "$W/sample"
  node_serve --capacity "$CAPACITY"
  node_mount
  read_sample
  fusermount3 -u "$W/mnt"
  node_stop
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
    if [ -n "${SITE:-}" ]; then start_helper; fi
    drop
    t0=$(now)
    node_serve --capacity "$CAPACITY" "${site_args[@]}" ${SITE:+--node-id 0}
    t=$(cat "$W/start.t")
    echo "$t" >> "$W/starts.$b"
    echo "run $run, build $b: $t s until the service answers, RSS $(status_of VmRSS) MiB" \
      "(peak $(status_of VmHWM) MiB), $(node_stat cached_files) files cached"
    if [ -n "${SITE:-}" ]; then
      echo "  all published again $(published "$t0") s after the start, RSS" \
        "$(status_of VmRSS) MiB (peak $(status_of VmHWM) MiB)"
    fi
    node_stop
  done
done
for b in "${!builds[@]}"; do
  echo "build $b (${builds[$b]}): restart, median of $RUNS: $(tail -n "$RUNS" "$W/starts.$b" |
    median) s (range $(tail -n "$RUNS" "$W/starts.$b" | sort -g | sed -n '1p;$p' | paste -sd-) s)"
done

node_serve --capacity "$CAPACITY"
node_mount
drop
t0=$(now)
read_sample
t1=$(now)
echo "the sample of $SAMPLE after the restarts: $(printf '%.3f' "$(echo "$t1 - $t0" | bc -l)") s," \
  "$(node_stat local_hits) local hits, $(node_stat bytes_from_backing) bytes from the shared FS"
fusermount3 -u "$W/mnt"
