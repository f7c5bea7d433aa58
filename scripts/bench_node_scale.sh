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
cleanup() {
  set +e
  unmount_mounted "$W/mnt"
  [ -z "$service" ] || { kill "$service"; wait "$service"; } 2> /dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
if [ ! -f "$W/shared/.done" ]; then
  echo "generating $N files in $DIRS directories" >&2
  python3 - "$W/shared" "$N" "$DIRS" <<'PY'
import os, random, sys
root, n, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(1)
blob = os.urandom(4096)
for d in range(dirs):
    os.makedirs(os.path.join(root, f"d{d}"), exist_ok=True)
for i in range(n):
    with open(os.path.join(root, f"d{i % dirs}", f"{i}.bin"), "wb") as f:
        f.write(blob[: rnd.randint(1024, 4096)])
open(os.path.join(root, ".done"), "w").close()
PY
fi
(cd "$W/shared" && find . -name '*.bin' | shuf --random-source=<(yes)) > "$W/order"

# start: starts the service and waits until it answers; the seconds that took in $W/start.t
# (called in this shell, never in $(...): the service would hold the substitution's pipe).
start() {
  "$BIN" node serve --ssd "$W/node" --socket "$W/node.sock" > /dev/null 2>> "$W/node.log" &
  service=$!
  local t0
  t0=$(now)
  until "$BIN" node status --socket "$W/node.sock" > /dev/null 2>&1; do sleep 0.05; done
  echo "$(now) - $t0" | bc -l > "$W/start.t"
}
rss() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' /proc/"$service"/status; }
stat_of() {
  "$BIN" node status --socket "$W/node.sock" --json |
    python3 -c "import json,sys; print(json.load(sys.stdin)['datasets'][0]['$1'])"
}
mount_it() {
  "$BIN" mount "$W/mnt" --ssd "$W/unused" --backing "$W/shared" --node-socket "$W/node.sock" \
    2> /dev/null
}

start
mount_it
drop
t0=$(now)
(cd "$W/mnt" && xargs -P4 -n 256 cat < "$W/order" > /dev/null)
t1=$(now)
echo "read $N files through the service, cold: $(echo "$t1 - $t0" | bc -l | cut -c1-6) s"
fusermount3 -u "$W/mnt"
files=$(stat_of cached_files)
echo "service with $files files cached: RSS $(rss) MiB"
kill "$service"
wait "$service" || true
start
echo "restart: $(cut -c1-5 "$W/start.t") s until the service answers, RSS $(rss) MiB after" \
  "(peak $(awk '/VmHWM/ {printf "%.1f", $2 / 1024}' /proc/"$service"/status) MiB)"
mount_it
head -n "$SAMPLE" "$W/order" > "$W/sample"
drop
t0=$(now)
(cd "$W/mnt" && xargs -P4 -n 256 cat < "$W/sample" > /dev/null)
t1=$(now)
echo "a sample of $SAMPLE after the restart: $(echo "$t1 - $t0" | bc -l | cut -c1-6) s," \
  "$(stat_of local_hits) local hits, $(stat_of bytes_from_backing) bytes from the shared FS"
fusermount3 -u "$W/mnt"
