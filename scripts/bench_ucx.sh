#!/usr/bin/env bash
# UCX data plane benchmark, side by side in one run (medians of RUNS runs):
#   dyadfs: pull a 1 GiB file between two processes (`dyadfs transport serve|pull`),
#   ucx_perftest -t ucp_get with the same message size (the chunk size) on the same transport.
# Usage: scripts/bench_ucx.sh [TLS]   (default tcp over loopback; e.g. "shm" or "all")
# Env: RUNS (5), CHUNK (2097152), WINDOW (4), DYADFS_BIN (a dyadfs binary to measure instead of
# building this tree, e.g. an older commit's for a side-by-side comparison).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-5}
CHUNK=${CHUNK:-2097152}
WINDOW=${WINDOW:-4}
export UCX_TLS=${1:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
# The tcp segment size dyadfs uses (src/transport/ucx): ucx_perftest gets the same.
export UCX_TCP_TX_SEG_SIZE=${UCX_TCP_TX_SEG_SIZE:-256k} UCX_TCP_RX_SEG_SIZE=${UCX_TCP_RX_SEG_SIZE:-256k}
[ "$UCX_TLS" = all ] && unset UCX_NET_DEVICES
build_dyadfs
W=$(mktemp -d /var/tmp/dyadfs-ucx-bench.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"; }
trap cleanup EXIT
head -c 1G /dev/urandom > "$W/big.bin"
PORT=$((7500 + RANDOM % 1000))
"$BIN" transport serve --root "$W" --listen 127.0.0.1:$PORT --slots 32 --slot-size $CHUNK > "$W/serve.log" 2>&1 &
PIDS+=($!)
until grep -q serving "$W/serve.log"; do sleep 0.1; done
for _ in $(seq "$RUNS"); do
  "$BIN" transport pull --peer 127.0.0.1:$PORT --path big.bin --version-of "$W/big.bin" \
    --out "$W/out.bin" --window "$WINDOW" --slot-size $CHUNK | sed -n 's/.*: \([0-9.]*\) MB\/s/\1/p'
done > "$W/dyadfs.txt"
cmp "$W/out.bin" "$W/big.bin"
rm -f "$W/out.bin"
ITERS=$((1073741824 / CHUNK))
for _ in $(seq "$RUNS"); do
  PP=$((PORT + 1))
  perftest_get "$CHUNK" "$ITERS" "$PP" "$W/perf-srv.log"
done > "$W/perftest.txt"
D=$(median < "$W/dyadfs.txt"); P=$(median < "$W/perftest.txt")
printf 'UCX_TLS=%s, %d-byte chunks, 1 GiB, medians of %d runs\n' "$UCX_TLS" $CHUNK "$RUNS"
printf '  dyadfs pull (window %d, byte-exact)   %8.1f MB/s   runs: %s\n' "$WINDOW" "$D" "$(tr '\n' ' ' < "$W/dyadfs.txt")"
printf '  ucx_perftest -t ucp_get               %8.1f MB/s   runs: %s\n' "$P" "$(tr '\n' ' ' < "$W/perftest.txt")"
printf '  ratio dyadfs / ucx_perftest           %8.2f\n' "$(echo "$D / $P" | bc -l)"
