#!/usr/bin/env bash
# Two-node read benchmark, side by side in one run (medians of RUNS runs): a 1 GiB file read
# through node B's mount while only node A holds it (pulled over UCX into B's cache), vs
# ucx_perftest -t ucp_get with the same message size (the chunk size) on the same transport.
# Usage: scripts/bench_cluster.sh [TLS]   (default tcp over loopback)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
CHUNK=2097152
export UCX_TLS=${1:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
# The tcp segment size the daemons use (src/transport/ucx): ucx_perftest gets the same.
export UCX_TCP_TX_SEG_SIZE=${UCX_TCP_TX_SEG_SIZE:-256k} UCX_TCP_RX_SEG_SIZE=${UCX_TCP_RX_SEG_SIZE:-256k}
# DYADFS_BIN: a dyadfs binary to measure instead of this tree's release build.
[ -n "${DYADFS_BIN:-}" ] || { scripts/install-deps.sh; cargo build --release --quiet; }
BIN=${DYADFS_BIN:-$PWD/target/release/dyadfs}
W=$(mktemp -d /var/tmp/dyadfs-cluster-bench.XXXX)
cleanup() {
  for n in a b; do mountpoint -q "$W/$n/mnt" && fusermount3 -u "$W/$n/mnt"; done
  rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/backing" "$W"/{a,b}/mnt
# The job secret every node proves on every connection (as `dyadfs keygen` writes it; made
# here so that an older DYADFS_BIN, which ignores it, can be measured too).
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$W/secret")
export DYADFS_SECRET_FILE=$W/secret
head -c 1G /dev/urandom > "$W/backing/big.bin"
PORT=$((9000 + RANDOM % 1000))
printf '0 127.0.0.1:%d r0\n1 127.0.0.1:%d r0\n' $PORT $((PORT + 1)) > "$W/peers"
mount_node() { "$BIN" mount "$W/$1/mnt" --ssd "$W/$1/ssd" --backing "$W/backing" --node-id "$2" --peers "$W/peers" ${MOUNT_ARGS:-}; }
mount_node a 0
cat "$W/a/mnt/big.bin" > /dev/null    # node A fetches it from the shared FS
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# dyadfs and ucx_perftest alternate, so both see the machine in the same state (on a shared
# VM, whole-script runs differ by up to 40%).
PP=$((PORT + 2))
for _ in $(seq "$RUNS"); do
  # B restarts empty; A re-announces its copy to B's tables as B starts.
  rm -rf "$W/b/ssd"; mount_node b 1
  sync; echo 3 > /proc/sys/vm/drop_caches
  t0=$(date +%s.%N)
  dd if="$W/b/mnt/big.bin" of=/dev/null bs=1M 2>/dev/null
  t1=$(date +%s.%N)
  peers=$("$BIN" stats "$W/b/mnt" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes_from_peers"])')
  [ "$peers" = 1073741824 ] || { echo "node B pulled $peers bytes from peers, expected 1 GiB" >&2; exit 1; }
  cmp "$W/b/mnt/big.bin" "$W/backing/big.bin"
  fusermount3 -u "$W/b/mnt"; sleep 0.3
  printf "%.1f\n" "$(echo "1073.741824 / ($t1 - $t0)" | bc -l)" >> "$W/dyadfs.txt"

  ucx_perftest -t ucp_get -s $CHUNK -n 512 -p $PP > /dev/null 2>&1 &
  SRV=$!
  sleep 0.5
  ucx_perftest 127.0.0.1 -t ucp_get -s $CHUNK -n 512 -p $PP 2>/dev/null |
    awk '/^Final:/ {printf "%.1f\n", $7 * 1.048576}' >> "$W/perftest.txt"
  wait $SRV || true
done
D=$(median < "$W/dyadfs.txt"); P=$(median < "$W/perftest.txt")
printf 'UCX_TLS=%s, 1 GiB read through node B while only node A holds it, medians of %d runs\n' "$UCX_TLS" "$RUNS"
printf '  dyadfs (dd bs=1M through B, byte-exact)  %8.1f MB/s   runs: %s\n' "$D" "$(tr '\n' ' ' < "$W/dyadfs.txt")"
printf '  ucx_perftest -t ucp_get (2 MiB)          %8.1f MB/s   runs: %s\n' "$P" "$(tr '\n' ' ' < "$W/perftest.txt")"
printf '  ratio of the medians                      %8.2f\n' "$(echo "$D / $P" | bc -l)"
printf '  median of the per-run ratios              %8.2f\n' \
  "$(paste "$W/dyadfs.txt" "$W/perftest.txt" | awk '{print $1 / $2}' | median)"
