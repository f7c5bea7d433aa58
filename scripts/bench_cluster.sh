#!/usr/bin/env bash
# Two-node read benchmark, side by side in one run (medians of RUNS runs): a 1 GiB file read
# through node B's mount while only node A holds it (pulled over UCX into B's cache), vs
# ucx_perftest -t ucp_get with the same message size (the chunk size) on the same transport.
# Usage: scripts/bench_cluster.sh [TLS]   (default tcp over loopback)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-5}
CHUNK=2097152
export UCX_TLS=${1:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
# The tcp segment size the daemons use (src/transport/ucx): ucx_perftest gets the same.
export UCX_TCP_TX_SEG_SIZE=${UCX_TCP_TX_SEG_SIZE:-256k} UCX_TCP_RX_SEG_SIZE=${UCX_TCP_RX_SEG_SIZE:-256k}
# DYADFS_BIN: a dyadfs binary to measure instead of this tree's release build.
# BINS: several builds to compare, interleaved run by run, each entry a binary with optional
# mount options after a colon (e.g. "old/dyadfs new/dyadfs new/dyadfs:--data-plane=ucx,--ucx-over-tcp"); both
# nodes run the entry measured.
build_dyadfs
read -r -a BINS <<< "${BINS:-$BIN}"
W=$(mktemp -d /var/tmp/dyadfs-cluster-bench.XXXX)
cleanup() {
  unmount_mounted "$W"/{a,b}/mnt
  rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/backing" "$W"/{a,b}/mnt
job_secret "$W/secret"
head -c 1G /dev/urandom > "$W/backing/big.bin"
PORT=$((9000 + RANDOM % 1000))
printf '0 127.0.0.1:%d r0\n1 127.0.0.1:%d r0\n' $PORT $((PORT + 1)) > "$W/peers"
remount_holder "${BINS[0]}"
cat "$W/a/mnt/big.bin" > /dev/null    # node A fetches it from the shared FS
# dyadfs and ucx_perftest alternate, so both see the machine in the same state (on a shared
# VM, whole-script runs differ by up to 40%).
PP=$((PORT + 2))
for _ in $(seq "$RUNS"); do
  for i in "${!BINS[@]}"; do
    # B restarts empty; A re-announces its copy to B's tables as B starts.
    remount_holder "${BINS[$i]}"
    rm -rf "$W/b/ssd"
    BIN=$(bin_of "${BINS[$i]}") BIN_ARGS=$(args_of "${BINS[$i]}") mount_node b 1
    drop
    t0=$(now)
    dd if="$W/b/mnt/big.bin" of=/dev/null bs=1M 2>/dev/null
    t1=$(now)
    peers=$(BIN=$(bin_of "${BINS[$i]}") dyadfs_stat "$W/b/mnt" bytes_from_peers)
    [ "$peers" = 1073741824 ] || { echo "node B pulled $peers bytes from peers, expected 1 GiB" >&2; exit 1; }
    cmp "$W/b/mnt/big.bin" "$W/backing/big.bin"
    fusermount3 -u "$W/b/mnt"; sleep 0.3
    printf "%.1f\n" "$(echo "1073.741824 / ($t1 - $t0)" | bc -l)" >> "$W/dyadfs-$i.txt"
  done
  perftest_get "$CHUNK" 512 "$PP" /dev/null >> "$W/perftest.txt"
done
P=$(median < "$W/perftest.txt")
printf 'UCX_TLS=%s, 1 GiB read through node B while only node A holds it, medians of %d runs\n' "$UCX_TLS" "$RUNS"
for i in "${!BINS[@]}"; do
  D=$(median < "$W/dyadfs-$i.txt")
  [ "${#BINS[@]}" -gt 1 ] && echo "  B$i = ${BINS[$i]}"
  printf '  dyadfs (dd bs=1M through B, byte-exact)  %8.1f MB/s   runs: %s\n' "$D" "$(tr '\n' ' ' < "$W/dyadfs-$i.txt")"
  printf '  ratio of the medians to ucx_perftest      %8.2f\n' "$(echo "$D / $P" | bc -l)"
  printf '  median of the per-run ratios              %8.2f\n' \
    "$(paste "$W/dyadfs-$i.txt" "$W/perftest.txt" | awk '{print $1 / $2}' | median)"
done
printf '  ucx_perftest -t ucp_get (2 MiB)          %8.1f MB/s   runs: %s\n' "$P" "$(tr '\n' ' ' < "$W/perftest.txt")"
