#!/usr/bin/env bash
# Producer/consumer benchmark, side by side in one run (medians of RUNS runs): N frames written
# by the C producer (examples/c) on one node and read back by the C consumer on another,
#   (a) through dyadfs: producer on node A's mount, consumer on node B's (UCX over tcp on lo);
#   (b) through a shared directory: an ext4 image on a loop device whose reads are throttled
#       with the cgroup v1 blkio controller (THROTTLE bytes/s, a slow parallel file system).
# Frame sizes are the MD frames of DYAD's HiCOMB'24 study: 644 KiB and 28.5 MiB. The page cache
# is dropped between producing and consuming (another node has none of the producer's pages).
# Needs root. Usage: scripts/bench_produce.sh    (env: RUNS, THROTTLE, SMALL_N, LARGE_N)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-3}
THROTTLE=${THROTTLE:-$((100 << 20))}
SMALL_N=${SMALL_N:-400}
LARGE_N=${LARGE_N:-16}
export UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
scripts/install-deps.sh
cargo build --release --quiet
BIN=$PWD/target/release/dyadfs
W=$(mktemp -d /var/tmp/dyadfs-produce-bench.XXXX)
. scripts/lib/slow-fs.sh
cleanup() {
  unmount_mounted "$W"/{a,b}/mnt
  slow_fs_stop
  rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W"/{a,b}/mnt "$W/bin"
job_secret "$W/secret"
gcc -O2 -o "$W/bin/producer" examples/c/producer.c
gcc -O2 -o "$W/bin/consumer" examples/c/consumer.c

# The slow shared file system; this shell and every process below read it throttled.
slow_fs_start "$W/shared" 8G "$THROTTLE"
mkdir -p "$W/shared/backing"

PORT=$((9000 + RANDOM % 1000))
printf '0 127.0.0.1:%d r0\n1 127.0.0.1:%d r0\n' $PORT $((PORT + 1)) > "$W/peers"
# Not common.sh's mount_node: the backing directory is on the slow shared FS, the daemons wait
# up to 60 s for their peers, and MOUNT_ARGS does not apply.
mount_node() {
  "$BIN" mount "$W/$1/mnt" --ssd "$W/$1/ssd" --backing "$W/shared/backing" --node-id "$2" \
    --peers "$W/peers" --wait 60s
}
unmount_nodes() {
  local m
  for m in a b; do fusermount3 -u "$W/$m/mnt"; done
  sleep 0.3
  rm -rf "$W"/{a,b}/ssd
}

# One run: prints "produce_MBps consume_MBps end_to_end_MBps" for frames of $2 bytes x $3
# written into $4 and read from $5.
run() {
  local n=$2 size=$3 out=$4 in=$5 t0 t1 t2
  mkdir -p "$out"
  t0=$(now)
  "$W/bin/producer" "$out" "$n" "$size" > /dev/null
  t1=$(now)
  drop
  t2=$(now)
  "$W/bin/consumer" "$in" "$n" "$size" > /dev/null
  local t3; t3=$(now)
  echo "$n * $size / 1000000" | bc -l | awk -v p="$(echo "$t1 - $t0" | bc -l)" \
    -v c="$(echo "$t3 - $t2" | bc -l)" '{printf "%.1f %.1f %.1f\n", $1 / p, $1 / c, $1 / (p + c)}'
}

printf 'frames          config        produce MB/s  consume MB/s  end-to-end MB/s   (medians of %d runs)\n' "$RUNS"
for spec in "644KiB 659456 $SMALL_N" "28.5MiB 29884416 $LARGE_N"; do
  read -r label size n <<< "$spec"
  for _ in $(seq "$RUNS"); do
    mount_node a 0; mount_node b 1
    run dyadfs "$n" "$size" "$W/a/mnt/frames" "$W/b/mnt/frames" >> "$W/dyadfs-$label"
    peers=$(dyadfs_stat "$W/b/mnt" bytes_from_peers)
    [ "$peers" = $((n * size)) ] || { echo "node B pulled $peers bytes, expected $((n * size))" >&2; exit 1; }
    unmount_nodes
    rm -rf "$W/shared/frames"
    run shared "$n" "$size" "$W/shared/frames" "$W/shared/frames" >> "$W/shared-$label"
    rm -rf "$W/shared/frames"
  done
  for cfg in dyadfs shared; do
    f="$W/$cfg-$label"
    printf '%-7s x %-5s %-12s %12.1f  %12.1f  %15.1f\n' "$label" "$n" "$cfg" \
      "$(cut -d' ' -f1 "$f" | median)" "$(cut -d' ' -f2 "$f" | median)" "$(cut -d' ' -f3 "$f" | median)"
  done
done
printf 'shared = ext4 on a loop device, reads throttled to %d MiB/s (cgroup v1 blkio); dyadfs = 2 daemons, UCX_TLS=%s\n' \
  $((THROTTLE >> 20)) "$UCX_TLS"
