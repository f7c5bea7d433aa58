#!/usr/bin/env bash
# The node service (issue 72) on one node, side by side in one run: user 1 (job A) reads a
# dataset through the node service, filling the node's cache from the shared file system once;
# then, every run, user 2 (job B) mounts the same dataset through the service and reads every
# file of it once, its first epoch, against:
#   local   user 2 reading a local copy on the same disk (the physical limit)
#   node    user 2's fresh mount attached to the service: every file the node's copy, every open
#           judged as user 2 by the shared file system
#   own     a job's own daemon (root, --no-node) whose cache holds the dataset: what a job that
#           cached it itself reads in its later epochs
# The reader is 4 Python processes reading their quarter of the shuffled files whole (a
# DataLoader's workers), as user 2; the page cache is dropped before each run, the
# configurations interleaved run by run. Also: bytes user 2's mounts read from the shared FS
# (must be 0), and the daemon CPU per file (the service's threads, the own daemon's).
# Needs root (users are made with useradd). Usage: scripts/bench_node.sh [WORKDIR]
# Env: RUNS (5), FILES (2048), SIZE (131072), DYADFS_BIN (a build to measure).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-5}
FILES=${FILES:-2048}
SIZE=${SIZE:-131072}
build_dyadfs
W=${1:-$(mktemp -d /var/tmp/dyadfs-bench-node.XXXX)}
chmod 755 "$W"
mkdir -p "$W"/{shared,local,node,own-ssd,mnt-a,mnt-b,mnt-own}
bench_users dyadfs-user dyadfs-u2
chown dyadfs-user: "$W/mnt-a"
chown dyadfs-u2: "$W/mnt-b"
fuse_mode=$(stat -c %a /dev/fuse)
service=
cleanup() {
  unmount_users "$W/mnt-a" "$W/mnt-b" "$W/mnt-own"
  [ -z "$service" ] || kill "$service" 2> /dev/null || true
  chmod "$fuse_mode" /dev/fuse
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
chmod 666 /dev/fuse # users mount through fusermount3, which opens it as them

random_files "$W/shared" "$FILES" "$SIZE"
cp -a "$W/shared/." "$W/local/"
ls "$W/shared" | shuf --random-source=<(yes) > "$W/order"
chmod 644 "$W/order"
as() { setpriv --reuid="$1" --regid="$1" --clear-groups "${@:2}"; }
# Users run the system's python (a root-only pyenv shim would refuse them); the readers are
# scripts/lib/readers.py, which every user may read.
PY=/usr/bin/python3
READERS=$PWD/scripts/lib/readers.py

"$BIN" node serve --ssd "$W/node" --socket "$W/node.sock" 2> "$W/node.log" &
service=$!
until "$BIN" node status --socket "$W/node.sock" > /dev/null 2>&1; do sleep 0.2; done
status() { "$BIN" node status --socket "$W/node.sock" --json; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)['datasets'][0]['$1'])"; }

# Job A: user 1's epoch 1 fills the node's cache from the shared file system.
as dyadfs-user "$BIN" mount "$W/mnt-a" --ssd "$W/unused" --backing "$W/shared" \
  --node-socket "$W/node.sock" 2> /dev/null
drop
t=$(as dyadfs-user $PY "$READERS" "$W/mnt-a" "$W/order")
fusermount3 -u "$W/mnt-a"
printf 'job A (user 1), epoch 1 through the service from the shared FS: %.3f s\n' "$t"
from_shared=$(status | field bytes_from_backing)

# The job's own daemon, its cache filled once (its later epochs are what it compares with).
"$BIN" mount "$W/mnt-own" --ssd "$W/own-ssd" --backing "$W/shared" --no-node -o allow_other
python3 "$READERS" "$W/mnt-own" "$W/order" > /dev/null
own_pid=$(pgrep -f -- " mount $W/mnt-own " | head -1)

printf '%-4s %8s %8s %8s %14s %14s\n' run local node own "node us/file" "own us/file"
: > "$W/local.t"; : > "$W/node.t"; : > "$W/own.t"; : > "$W/node.cpu"; : > "$W/own.cpu"
for r in $(seq "$RUNS"); do
  drop
  tl=$(as dyadfs-u2 $PY "$READERS" "$W/local" "$W/order")
  as dyadfs-u2 "$BIN" mount "$W/mnt-b" --ssd "$W/unused" --backing "$W/shared" \
    --node-socket "$W/node.sock" 2> /dev/null
  drop
  c0=$(threads_cpu_ms "$service")
  tn=$(as dyadfs-u2 $PY "$READERS" "$W/mnt-b" "$W/order")
  c1=$(threads_cpu_ms "$service")
  fusermount3 -u "$W/mnt-b"
  drop
  o0=$(threads_cpu_ms "$own_pid")
  to=$(as dyadfs-u2 $PY "$READERS" "$W/mnt-own" "$W/order")
  o1=$(threads_cpu_ms "$own_pid")
  nu=$(echo "($c1 - $c0) * 1000 / $FILES" | bc -l)
  ou=$(echo "($o1 - $o0) * 1000 / $FILES" | bc -l)
  printf '%-4s %8.3f %8.3f %8.3f %14.0f %14.0f\n' "$r" "$tl" "$tn" "$to" "$nu" "$ou"
  # (Milliseconds, as printed.)
  printf '%.3f\n' "$tl" >> "$W/local.t"
  printf '%.3f\n' "$tn" >> "$W/node.t"
  printf '%.3f\n' "$to" >> "$W/own.t"
  echo "$nu" >> "$W/node.cpu"; echo "$ou" >> "$W/own.cpu"
done
after=$(status | field bytes_from_backing)
range() { sort -g "$1" | awk '{a[NR]=$1} END {printf "%s-%s", a[1], a[NR]}'; }
ml=$(median < "$W/local.t"); mn=$(median < "$W/node.t"); mo=$(median < "$W/own.t")
echo
echo "median (range) of $RUNS runs, $FILES files of $SIZE bytes, 4 readers, page cache dropped:"
echo "  local copy            $ml s ($(range "$W/local.t"))"
echo "  node service, user 2  $mn s ($(range "$W/node.t")): $(echo "$mn / $ml" | bc -l | cut -c1-4)x the local copy, daemon $(median < "$W/node.cpu" | cut -d. -f1) us/file"
echo "  own daemon's cache    $mo s ($(range "$W/own.t")): $(echo "$mo / $ml" | bc -l | cut -c1-4)x the local copy, daemon $(median < "$W/own.cpu" | cut -d. -f1) us/file"
echo "  bytes user 2's mounts read from the shared FS: $((after - from_shared)) (user 1's epoch 1: $from_shared)"
