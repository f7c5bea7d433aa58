#!/usr/bin/env bash
# The node service holding many files (issue 72's "scale for it"): N small files (1-4 KiB) in
# DIRS directories are read once through a mount the service serves, then the service is
# stopped and started again. Prints the service's RSS with N files cached, how long the restart
# takes until it answers (every dataset's cache loaded), its RSS after, and a sample of SAMPLE
# files read through a new mount (all must be local hits). Needs root.
# Usage: scripts/bench_node_scale.sh [WORKDIR]
# Env: N (1000000), DIRS (1000), SAMPLE (10000), KEEP (keep WORKDIR and reuse its files),
#      DYADFS_BIN (a build to measure).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
N=${N:-1000000} DIRS=${DIRS:-1000} SAMPLE=${SAMPLE:-10000}
build_dyadfs
W=${1:-$(mktemp -d /var/tmp/dyadfs-node-scale.XXXX)}
mkdir -p "$W"/{shared,mnt}
service=
trap node_cleanup EXIT
if [ ! -f "$W/shared/.done" ]; then
  echo "generating $N files in $DIRS directories" >&2
  small_files "$W/shared" "$N" "$DIRS"
  touch "$W/shared/.done"
fi
(cd "$W/shared" && find . -name '*.bin' | shuf --random-source=<(yes)) > "$W/order"

rss() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' /proc/"$service"/status; }

node_serve
node_mount
drop
t0=$(now)
(cd "$W/mnt" && xargs -P4 -n 256 cat < "$W/order" > /dev/null)
t1=$(now)
echo "read $N files through the service, cold: $(echo "$t1 - $t0" | bc -l | cut -c1-6) s"
fusermount3 -u "$W/mnt"
files=$(node_stat cached_files)
echo "service with $files files cached: RSS $(rss) MiB"
node_stop
node_serve
echo "restart: $(cat "$W/start.t") s until the service answers, RSS $(rss) MiB after" \
  "(peak $(awk '/VmHWM/ {printf "%.1f", $2 / 1024}' /proc/"$service"/status) MiB)"
node_mount
head -n "$SAMPLE" "$W/order" > "$W/sample"
drop
t0=$(now)
(cd "$W/mnt" && xargs -P4 -n 256 cat < "$W/sample" > /dev/null)
t1=$(now)
echo "a sample of $SAMPLE after the restart: $(echo "$t1 - $t0" | bc -l | cut -c1-6) s," \
  "$(node_stat local_hits) local hits, $(node_stat bytes_from_backing) bytes from the shared FS"
fusermount3 -u "$W/mnt"
