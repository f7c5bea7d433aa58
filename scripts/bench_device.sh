#!/usr/bin/env bash
# Issue 49's comparisons in one call on a lent many-core machine (the `device` tool), where there
# is no cargo: the release builds are carried there and every stage runs under a time limit of
# its own, so that what a stage printed comes back even if the machine's time runs out.
#   1. the unmodified DataLoader at 16,384 x 64 KiB, then at 4096 x 256 KiB: the local copy,
#      the FUSE floor and dyadfs alternated run by run, FUSE requests, daemon threads and
#      counters per sample (scripts/bench_dataloader.sh);
#   2. a pulled 64 KiB file's daemon CPU against the floors, Python readers
#      (scripts/bench_small_pull.sh FLOOR=1).
# Build here first (`cargo build --release && cargo build --release --example fuse_floor
# --example pull_floor`), then call the device tool with
#   command: scripts/bench_device.sh
#   carry:   target/release/dyadfs target/release/examples/fuse_floor target/release/examples/pull_floor
#   timeout_s: 590
# Each stage's log lands in $OUT (the device tool's folder that comes back). Tools the scripts
# use that the machine lacks (bc, fusermount3) are stood in for by a few lines each. Tried on the
# 2-vCPU VM with cargo off PATH and small sizes (F64=1024 F256=256 FP=256 RUNS_DL=1 RUNS_P=1):
# 159 s; and with every stage cut at a short limit: nothing left running, mounted (FUSE or the
# loop image) or on disk of the cut stages, a work directory from before kept.
# Env: PY (python3 with torch), TA TB TC (each stage's limit, s), F64 F256 FP (files), RUNS_DL
# RUNS_P (runs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d /var/tmp/dyadfs-device.XXXX)}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "== $(($(date +%s) - T0)) s: $*"; }
SHIM=$(mktemp -d /tmp/dyadfs-shim.XXXX)
command -v bc > /dev/null ||
  printf '#!/bin/sh\nexec python3 -c "import sys; print(eval(sys.stdin.read()))"\n' > "$SHIM/bc"
command -v fusermount3 > /dev/null ||
  printf '#!/bin/sh\n[ "$1" = -u ] && shift\nexec umount "$@"\n' > "$SHIM/fusermount3"
chmod +x "$SHIM"/* 2> /dev/null
export PATH=$PATH:$SHIM
log "$(nproc) CPUs, kernel $(uname -r), $(free -g | awk '/Mem/ {print $2}') GiB; stood in for: $(ls "$SHIM" | tr '\n' ' ')"
export PY=${PY:-python3} DYADFS_BIN=$PWD/target/release/dyadfs
"$PY" -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)'
"$DYADFS_BIN" --version
# Between stages: nothing of a stage cut at its limit is left running or mounted.
tidy() {
  pkill -f "$DYADFS_BIN mount"
  pkill -f target/release/examples/fuse_floor
  pkill -f scripts/workload/train.py
  sleep 1
  # (Only the benchmarks' own mounts, FUSE and the cache's loop image: their work directories
  # are /var/tmp/dyadfs-*. The last listed first: a mount inside another goes before it.)
  awk '$2 ~ /^\/var\/tmp\/dyadfs-/ {print $2}' /proc/mounts | tac |
    while read -r m; do umount -l "$m"; done
  # A script cut at its limit leaves its work directory: those made since the stage began go.
  comm -13 <(printf '%s\n' "${WORKDIRS[@]}") <(workdirs) | while read -r d; do rm -rf "$d"; done
  return 0
}
workdirs() { ls -d /var/tmp/dyadfs-dataloader.* /var/tmp/dyadfs-small-bench.* 2> /dev/null | sort; }
# stage LIMIT NAME VAR=VALUE... SCRIPT: one benchmark under a time limit, its output kept.
stage() {
  local lim=$1 name=$2
  shift 2
  log "stage $name (limit $lim s): $*"
  mapfile -t WORKDIRS < <(workdirs)
  timeout -k 5 "$lim" env "$@" 2>&1 | tee "$OUT/$name.log"
  log "stage $name: rc ${PIPESTATUS[0]}"
  tidy
}
DL=(EPOCHS=3 THREADS=1 REQUESTS=1 STATS=1 CONFIGS="local fusefloor dyadfs" RUNS="${RUNS_DL:-2}")
stage "${TA:-230}" dataloader-64k "${DL[@]}" FILES="${F64:-16384}" SIZE=65536 scripts/bench_dataloader.sh
stage "${TB:-170}" dataloader-256k "${DL[@]}" FILES="${F256:-4096}" SIZE=262144 scripts/bench_dataloader.sh
FS=
if command -v mkfs.ext4 > /dev/null; then FS=ext4; fi
stage "${TC:-130}" pull-64k READER=python CACHE_FS="$FS" REPLICATE=0 EAGER=1M FLOOR=1 \
  RUNS="${RUNS_P:-3}" FILES="${FP:-1024}" SIZE=65536 scripts/bench_small_pull.sh
rm -rf "$SHIM"
log "done; logs in $OUT"
