#!/usr/bin/env bash
# The site (issue 72), side by side in one run: 8 node services on 127.0.0.1 (racks r0: nodes
# 0-3, r1: nodes 4-7) under one site key. Job A of user 1 on nodes 0-3 reads a dataset once
# (each node its quarter, from the shared file system). Then, every run, job B of user 2 on
# nodes 4-7 mounts the same dataset and reads it once, each node its quarter (its first epoch:
# nodes 4-7 hold nothing of it, evicted before each run), against:
#   local   user 2 reading a local copy on the same disk, the same quarters at once
#   site    user 2's mounts on nodes 4-7: every file pulled from the node of job A that holds
#           it, every open judged as user 2 by the shared file system
# Each node's reader is 4 Python processes reading their part of its quarter (a DataLoader's
# workers), all 16 at once; the page cache is dropped before each run, the configurations
# interleaved run by run. Also: bytes job B read from the shared FS (must be 0), and the CPU
# per file of the services that served (nodes 0-3) and that pulled (nodes 4-7).
# Needs root (users are made with useradd). Usage: scripts/bench_site.sh [WORKDIR]
# Env: RUNS (5), FILES (2048), SIZE (131072), DATA_PLANE (stream; ucx: over loopback tcp),
# PIN (0; 1: job A's nodes on CPU 0, job B's and the local copy's readers on CPU 1), DYADFS_BIN,
# PERF (a file: `perf record -g` of the pulling services, nodes 4-7, over every site epoch; then
# `perf report -i FILE --no-children` says where a pull's CPU goes).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-5}
FILES=${FILES:-2048}
SIZE=${SIZE:-131072}
DATA_PLANE=${DATA_PLANE:-stream}
build_dyadfs
W=${1:-$(mktemp -d /var/tmp/dyadfs-bench-site.XXXX)}
chmod 755 "$W"
bench_users dyadfs-user dyadfs-u2
mkdir -p "$W"/{shared,local,run}
for n in 0 1 2 3 4 5 6 7; do
  mkdir -p "$W/n$n/mnt"
  if [ "$n" -lt 4 ]; then chown dyadfs-user: "$W/n$n/mnt"; else chown dyadfs-u2: "$W/n$n/mnt"; fi
done
fuse_mode=$(stat -c %a /dev/fuse)
services=()
cleanup() {
  unmount_users "$W"/n{0,1,2,3,4,5,6,7}/mnt
  for p in "${services[@]}"; do kill "$p" 2> /dev/null || true; done
  chmod "$fuse_mode" /dev/fuse
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
chmod 666 /dev/fuse # users mount through fusermount3, which opens it as them

random_files "$W/shared" "$FILES" "$SIZE"
cp -a "$W/shared/." "$W/local/"
ls "$W/shared" | shuf --random-source=<(yes) > "$W/order"
for q in 0 1 2 3; do awk -v q="$q" 'NR % 4 == q' "$W/order" > "$W/shard$q"; done
chmod 644 "$W"/order "$W"/shard*
as() { setpriv --reuid="$1" --regid="$1" --clear-groups "${@:2}"; }
PY=/usr/bin/python3
READERS=$PWD/scripts/lib/readers.py

# The site: its peers file (free ports below the ephemeral range) and its key.
site_peers 8 4 > "$W/site.peers"
"$BIN" keygen "$W/site.key" 2> /dev/null
plane=(--data-plane "$DATA_PLANE")
if [ "$DATA_PLANE" = ucx ]; then # over loopback: tcp, acknowledged
  plane+=(--ucx-over-tcp)
  export UCX_TLS=tcp UCX_NET_DEVICES=lo
fi
# cpus NODE: where node NODE's service and readers run. PIN=1: nodes 0-3 on CPU 0, nodes 4-7
# (and the local copy's readers) on CPU 1, as if job A's and job B's nodes were other machines:
# job B then pays for its own end of each pull only, and the holders' CPU is not its readers'.
cpus() { if [ "${PIN:-0}" = 1 ]; then echo $(($1 / 4)); else echo "0-$(($(nproc) - 1))"; fi; }
for n in 0 1 2 3 4 5 6 7; do
  taskset -c "$(cpus "$n")" "$BIN" node serve --ssd "$W/n$n/ssd" --socket "$W/run/n$n.sock" --site-peers "$W/site.peers" \
    --node-id "$n" --site-key "$W/site.key" "${plane[@]}" 2> "$W/n$n.log" &
  services+=($!)
done
for n in 0 1 2 3 4 5 6 7; do
  until "$BIN" node status --socket "$W/run/n$n.sock" > /dev/null 2>&1; do sleep 0.2; done
done
status() { "$BIN" node status --socket "$W/run/n$1.sock" --json; }
field() {
  python3 -c "import json,sys; d=json.load(sys.stdin)['datasets']; print(d[0]['$1'] if d else 0)"
}
site_field() { python3 -c "import json,sys; print(json.load(sys.stdin)['site']['$1'])"; }
sum_field() { local s=0 n; for n in "${@:2}"; do s=$((s + $(status "$n" | field "$1"))); done; echo $s; }
cpu_of() { local n; for n in "$@"; do threads_cpu_ms "${services[$n]}"; echo; done | paste -sd+ | bc -l; }
mount_as() { # USER NODE
  as "$1" "$BIN" mount "$W/n$2/mnt" --ssd "$W/unused" --backing "$W/shared" \
    --node-socket "$W/run/n$2.sock" 2> /dev/null
}
# epoch USER NODE ROOT...: the four quarters read at once, ROOT i reading shard i, on node
# NODE's CPUs; prints seconds.
epoch() {
  local u=$1 c q=0 t0 r
  c=$(cpus "$2")
  shift 2
  t0=$(now)
  for r in "$@"; do
    as "$u" taskset -c "$c" $PY "$READERS" "$r" "$W/shard$q" > /dev/null &
    q=$((q + 1))
  done
  wait
  echo "$(now) - $t0" | bc -l
}

# Job A: user 1 on nodes 0-3, epoch 1 from the shared file system.
for n in 0 1 2 3; do mount_as dyadfs-user "$n"; done
drop
ta=$(epoch dyadfs-user 0 "$W"/n{0,1,2,3}/mnt)
for n in 0 1 2 3; do fusermount3 -u "$W/n$n/mnt"; done
printf 'job A (user 1, nodes 0-3), epoch 1 from the shared FS: %.3f s\n' "$ta"
key=$(status 0 | python3 -c "import json,sys; print(json.load(sys.stdin)['datasets'][0]['key'])")
until [ "$(( $(for n in 0 1 2 3 4 5 6 7; do status "$n" | site_field home_global_files; done | paste -sd+) ))" -ge "$FILES" ]; do
  sleep 0.2
done

printf '%-4s %8s %8s %16s %16s\n' run local site "holders us/file" "pullers us/file"
: > "$W/local.t"; : > "$W/site.t"; : > "$W/hold.cpu"; : > "$W/pull.cpu"
from_shared=0
for r in $(seq "$RUNS"); do
  drop
  tl=$(epoch dyadfs-u2 4 "$W/local" "$W/local" "$W/local" "$W/local")
  for n in 4 5 6 7; do mount_as dyadfs-u2 "$n"; done
  drop
  h0=$(cpu_of 0 1 2 3); p0=$(cpu_of 4 5 6 7)
  if [ -n "${PERF:-}" ]; then
    perf record -q -g -o "$PERF.$r" -p "$(IFS=,; echo "${services[*]:4:4}")" 2> /dev/null &
    perf_pid=$!
    sleep 0.5
  fi
  ts=$(epoch dyadfs-u2 4 "$W"/n{4,5,6,7}/mnt)
  if [ -n "${PERF:-}" ]; then kill -INT "$perf_pid"; wait "$perf_pid" || true; fi
  h1=$(cpu_of 0 1 2 3); p1=$(cpu_of 4 5 6 7)
  from_shared=$((from_shared + $(sum_field bytes_from_backing 4 5 6 7)))
  for n in 4 5 6 7; do
    fusermount3 -u "$W/n$n/mnt"
    # Job B's copies leave nodes 4-7: the next run is a first epoch again.
    "$BIN" node evict "$key" --socket "$W/run/n$n.sock" > /dev/null 2>&1 || true
  done
  hu=$(echo "($h1 - $h0) * 1000 / $FILES" | bc -l)
  pu=$(echo "($p1 - $p0) * 1000 / $FILES" | bc -l)
  printf '%-4s %8.3f %8.3f %16.0f %16.0f\n' "$r" "$tl" "$ts" "$hu" "$pu"
  printf '%.3f\n' "$tl" >> "$W/local.t"
  printf '%.3f\n' "$ts" >> "$W/site.t"
  echo "$hu" >> "$W/hold.cpu"; echo "$pu" >> "$W/pull.cpu"
done
range() { sort -g "$1" | awk '{a[NR]=$1} END {printf "%s-%s", a[1], a[NR]}'; }
ml=$(median < "$W/local.t"); ms=$(median < "$W/site.t")
echo
echo "median (range) of $RUNS runs, $FILES files of $SIZE bytes, 4 nodes x 4 readers, page cache dropped, data plane $DATA_PLANE, PIN=${PIN:-0}:"
echo "  local copy                $ml s ($(range "$W/local.t"))"
echo "  job B on nodes 4-7, site  $ms s ($(range "$W/site.t")): $(echo "$ms / $ml" | bc -l | cut -c1-4)x the local copy"
echo "  CPU per file: holders (nodes 0-3) $(median < "$W/hold.cpu" | cut -d. -f1) us, pullers (nodes 4-7) $(median < "$W/pull.cpu" | cut -d. -f1) us"
echo "  bytes job B read from the shared FS, all runs: $from_shared"
