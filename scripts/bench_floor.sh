#!/usr/bin/env bash
# The floor under a pulled small file's CPU: examples/pull_floor.rs moves FILES files of SIZE
# bytes between a holder and a puller thread per stream (STREAMS, as 4 readers) over loopback
# TCP with no dyadfs in the way, adding one cost at a time: the network alone, the holder's
# O_DIRECT read, AES-128-GCM on both sides, the store (a new file each, or appended to one
# preallocated segment). Reports files/s and each side's CPU per file, RUNS runs interleaved,
# every run printed, medians with their spread. Compare with scripts/bench_small_pull.sh's
# "daemon CPU per file" (puller + holder) on the same machine.
# CACHE_FS=ext4 (the default) puts the files on a fresh journaled ext4 image on a loop device, as
# `CACHE_FS=ext4 scripts/bench_small_pull.sh` puts B's cache; CACHE_FS= uses a temp dir of
# /var/tmp's file system (on the 2-vCPU VM ext4 without a journal, whose inode allocation for
# new files after many deletes is slow and erratic).
# Needs root (the loop device, and dropping the page cache before each run).
# Usage: scripts/bench_floor.sh   (env: RUNS, FILES, SIZE, STREAMS, CACHE_FS)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5} FILES=${FILES:-2048} SIZE=${SIZE:-262144} STREAMS=${STREAMS:-4}
CACHE_FS=${CACHE_FS-ext4}
cargo build --release --quiet --example pull_floor
W=$(mktemp -d /var/tmp/dyadfs-floor.XXXX)
cleanup() {
  if mountpoint -q "$W/fs"; then umount "$W/fs"; fi
  rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/fs"
if [ "$CACHE_FS" = ext4 ]; then
  truncate -s $((FILES * SIZE * 3 + (1 << 30))) "$W/fs.img"
  mkfs.ext4 -q -F "$W/fs.img"
  mount -o loop "$W/fs.img" "$W/fs"
fi
target/release/examples/pull_floor "$W/fs" "$FILES" "$SIZE" "$STREAMS" "$RUNS"
