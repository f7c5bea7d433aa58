#!/usr/bin/env bash
# What serving the site costs a node's own job (issue 72), side by side in one run. Two node
# services on 127.0.0.1, each pinned to a CPU of its own as if on two machines: node 0 (CPU 0)
# holds a dataset its job A (user 1) cached; every run, job A reads the whole dataset again
# (4 Python readers pinned to CPU 0, page cache dropped: its later epoch), either
#   alone     nothing else runs
#   serving   while job B of user 2 on node 1 (CPU 1) reads the same dataset through the site
#             again and again, every file pulled from node 0 at full rate (node 1's copies
#             evicted between its epochs)
# interleaved run by run. Prints every run, the medians and the ratio (the target: <= 1.05),
# and the bytes node 0 served meanwhile. Job B's pulls read node 0's cache files, which warms
# its page cache for job A's epoch too (as on a real node); DROP=0 keeps the page cache warm in
# both configurations instead, leaving only the CPU they share. Needs root and 2 CPUs.
# Usage: scripts/bench_site_serving.sh [WORKDIR]
# Env: RUNS (5), FILES (2048), SIZE (131072), DROP (1), SERVE_ARGS (extra `node serve` options for node 0,
# e.g. "--site-serve-rate 200M"), DYADFS_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-5}
FILES=${FILES:-2048}
SIZE=${SIZE:-131072}
build_dyadfs
W=${1:-$(mktemp -d /var/tmp/dyadfs-bench-serving.XXXX)}
chmod 755 "$W"
bench_users dyadfs-user dyadfs-u2
mkdir -p "$W"/{shared,run,n0/mnt,n1/mnt}
chown dyadfs-user: "$W/n0/mnt"
chown dyadfs-u2: "$W/n1/mnt"
fuse_mode=$(stat -c %a /dev/fuse)
services=()
loader=
cleanup() {
  [ -z "$loader" ] || kill "$loader" 2> /dev/null || true
  unmount_users "$W/n0/mnt" "$W/n1/mnt"
  for p in "${services[@]}"; do kill "$p" 2> /dev/null || true; done
  chmod "$fuse_mode" /dev/fuse
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
chmod 666 /dev/fuse # users mount through fusermount3, which opens it as them

random_files "$W/shared" "$FILES" "$SIZE"
ls "$W/shared" | shuf --random-source=<(yes) > "$W/order"
chmod 644 "$W/order"
as() { setpriv --reuid="$1" --regid="$1" --clear-groups "${@:2}"; }
PY=/usr/bin/python3
READERS=$PWD/scripts/lib/readers.py

site_peers 2 2 > "$W/site.peers"
"$BIN" keygen "$W/site.key" 2> /dev/null
# shellcheck disable=SC2086 # SERVE_ARGS are options, split
taskset -c 0 "$BIN" node serve --ssd "$W/n0/ssd" --socket "$W/run/n0.sock" \
  --site-peers "$W/site.peers" --node-id 0 --site-key "$W/site.key" --data-plane stream \
  ${SERVE_ARGS:-} 2> "$W/n0.log" &
services+=($!)
taskset -c 1 "$BIN" node serve --ssd "$W/n1/ssd" --socket "$W/run/n1.sock" \
  --site-peers "$W/site.peers" --node-id 1 --site-key "$W/site.key" --data-plane stream \
  2> "$W/n1.log" &
services+=($!)
for n in 0 1; do
  until "$BIN" node status --socket "$W/run/n$n.sock" > /dev/null 2>&1; do sleep 0.2; done
done
field() { # NODE KEY
  "$BIN" node status --socket "$W/run/n$1.sock" --json |
    python3 -c "import json,sys; d=json.load(sys.stdin)['datasets']; print(d[0]['$2'] if d else 0)"
}
mount_as() { # USER NODE
  as "$1" "$BIN" mount "$W/n$2/mnt" --ssd "$W/unused" --backing "$W/shared" \
    --node-socket "$W/run/n$2.sock" 2> /dev/null
}

# Job A caches the dataset on node 0 (its epoch 1, from the shared FS).
mount_as dyadfs-user 0
as dyadfs-user taskset -c 0 $PY "$READERS" "$W/n0/mnt" "$W/order" > /dev/null
key=$(field 0 key)

# Job B's loader on node 1: epoch after epoch through the site, its copies evicted between.
job_b() {
  while :; do
    mount_as dyadfs-u2 1
    as dyadfs-u2 taskset -c 1 $PY "$READERS" "$W/n1/mnt" "$W/order" > /dev/null || true
    fusermount3 -u "$W/n1/mnt"
    "$BIN" node evict "$key" --socket "$W/run/n1.sock" > /dev/null 2>&1 || true
  done
}

printf '%-4s %8s %8s %16s\n' run alone serving "served MiB/s"
: > "$W/alone.t"; : > "$W/serving.t"; : > "$W/rate"
cold() { if [ "${DROP:-1}" = 1 ]; then drop; fi; }
for r in $(seq "$RUNS"); do
  cold
  ta=$(as dyadfs-user taskset -c 0 $PY "$READERS" "$W/n0/mnt" "$W/order")
  job_b > /dev/null 2>&1 &
  loader=$!
  sleep 2 # job B at full rate
  cold
  s0=$(field 0 bytes_served_to_peers); t0=$(now)
  ts=$(as dyadfs-user taskset -c 0 $PY "$READERS" "$W/n0/mnt" "$W/order")
  s1=$(field 0 bytes_served_to_peers); t1=$(now)
  kill "$loader"; wait "$loader" 2> /dev/null || true
  loader=
  as dyadfs-u2 pkill -u dyadfs-u2 -f "$READERS" 2> /dev/null || true
  unmount_users "$W/n1/mnt"
  "$BIN" node evict "$key" --socket "$W/run/n1.sock" > /dev/null 2>&1 || true
  rate=$(echo "($s1 - $s0) / ($t1 - $t0) / 1048576" | bc -l)
  printf '%-4s %8.3f %8.3f %16.0f\n' "$r" "$ta" "$ts" "$rate"
  printf '%.3f\n' "$ta" >> "$W/alone.t"; printf '%.3f\n' "$ts" >> "$W/serving.t"
  echo "$rate" >> "$W/rate"
done
range() { sort -g "$1" | awk '{a[NR]=$1} END {printf "%s-%s", a[1], a[NR]}'; }
ma=$(median < "$W/alone.t"); ms=$(median < "$W/serving.t")
echo
echo "median (range) of $RUNS runs, $FILES files of $SIZE bytes, job A's 4 readers on CPU 0, node 0 ${SERVE_ARGS:-(defaults)}:"
echo "  alone     $ma s ($(range "$W/alone.t"))"
echo "  serving   $ms s ($(range "$W/serving.t")): $(echo "$ms / $ma" | bc -l | cut -c1-4)x alone, node 0 serving $(median < "$W/rate" | cut -d. -f1) MiB/s meanwhile"
