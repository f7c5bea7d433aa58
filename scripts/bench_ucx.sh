#!/usr/bin/env bash
# UCX data plane benchmark, side by side in one run (medians of RUNS runs):
#   dyadfs: pull a 1 GiB file between two processes (`dyadfs transport serve|pull`),
#   ucx_perftest -t ucp_get with the same message size (the chunk size) on the same transport.
# Usage: scripts/bench_ucx.sh [TLS]   (default tcp over loopback; e.g. "shm" or "all")
# Env: RUNS (5), CHUNK (2097152), WINDOW (4), DYADFS_BIN (a dyadfs binary to measure instead of
# building this tree), BINS (several binaries, e.g. two commits' builds, interleaved run by run).
# The pulls and ucx_perftest alternate run by run, so all see the machine in the same state.
# OUT_DIR: where each pull writes its 1 GiB copy (default the benchmark's directory under
# /var/tmp). On the 2-vCPU VM, pulls into a file on its disk are bimodal (300-450 or 1,000-2,000
# MB/s, in a pattern that follows their order in the run, with the disk's writeback); OUT_DIR=/dev/shm
# takes the disk out of the comparison.
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
# BINS: several dyadfs binaries (e.g. two commits' builds) pulled from in turn, run by run, each
# from its own server; the summary then has a line per binary. Default: the one binary, BIN.
read -r -a BINS <<< "${BINS:-$BIN}"
W=$(mktemp -d /var/tmp/dyadfs-ucx-bench.XXXX)
PIDS=()
OUT=${OUT_DIR:-$W}/dyadfs-ucx-bench-out.$$
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W" "$OUT"; }
trap cleanup EXIT
head -c 1G /dev/urandom > "$W/big.bin"
PORT=$((7500 + RANDOM % 1000))
for i in "${!BINS[@]}"; do
  "${BINS[$i]}" transport serve --root "$W" --listen 127.0.0.1:$((PORT + 1 + i)) --slots 32 \
    --slot-size "$CHUNK" > "$W/serve$i.log" 2>&1 &
  PIDS+=($!)
  until grep -q serving "$W/serve$i.log"; do sleep 0.1; done
done
for _ in $(seq "$RUNS"); do
  for i in "${!BINS[@]}"; do
    "${BINS[$i]}" transport pull --peer 127.0.0.1:$((PORT + 1 + i)) --path big.bin \
      --version-of "$W/big.bin" --out "$OUT" --window "$WINDOW" --slot-size "$CHUNK" |
      sed -n 's/.*: \([0-9.]*\) MB\/s/\1/p' >> "$W/dyadfs$i.txt"
    cmp "$OUT" "$W/big.bin"
    rm -f "$OUT"
  done
  perftest_get "$CHUNK" $((1073741824 / CHUNK)) "$PORT" "$W/perf-srv.log" >> "$W/perftest.txt"
done
P=$(median < "$W/perftest.txt")
printf 'UCX_TLS=%s, %d-byte chunks, 1 GiB, medians of %d runs\n' "$UCX_TLS" "$CHUNK" "$RUNS"
for i in "${!BINS[@]}"; do
  D=$(median < "$W/dyadfs$i.txt")
  printf '  dyadfs pull (window %d, byte-exact)   %8.1f MB/s   runs: %s  %s\n' "$WINDOW" "$D" \
    "$(tr '\n' ' ' < "$W/dyadfs$i.txt")" "${BINS[$i]}"
  printf '    median of the per-run ratios to ucx_perftest %.2f\n' \
    "$(paste "$W/dyadfs$i.txt" "$W/perftest.txt" | awk '{print $1 / $2}' | median)"
done
printf '  ucx_perftest -t ucp_get               %8.1f MB/s   runs: %s\n' "$P" "$(tr '\n' ' ' < "$W/perftest.txt")"
