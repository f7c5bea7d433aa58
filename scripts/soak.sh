#!/usr/bin/env bash
# The chaos soak (issue 17): 6 daemons in 3 racks (SOAK_NODES, SOAK_RACKS) on 127.0.0.1 (UCX over tcp on loopback), one
# reader per node reading the dataset in shifted shards and checking every byte, while a driver
# freezes, kills and restarts daemons at random, fills cache disks and flips bytes in cached
# files (scripts/soak.py). Reports reads, wrong bytes
# (exit 1 if any), errors, the longest read stall on a node that was up, shared-FS bytes
# against the dataset, failovers and the actions, and the five slowest live reads with their
# node, file and start time. SOAK_MOUNT_ARGS: mount options added on every node (e.g.
# "--page-cache-large-files"). KEEP=1 keeps the work directory, each node's log beside its cache
# disk. Needs root (FUSE). Loopback only.
# Usage: SOAK_SECONDS=600 scripts/soak.sh   (env: SOAK_NODES (6), SOAK_RACKS (3), SOAK_FILES, SOAK_KIB, SOAK_LARGE,
#        SOAK_LARGE_MIB, SOAK_PEER_TIMEOUT, SOAK_DETECT, SOAK_SEED, SOAK_START_WITH, SOAK_MOUNT_ARGS,
#        DYADFS_BIN, KEEP)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
[ "$(id -u)" -eq 0 ] || { echo "soak.sh needs root (FUSE mounts)" >&2; exit 1; }
build_dyadfs
W=$(mktemp -d /var/tmp/dyadfs-soak.XXXX)
cleanup() {
  # Anything the driver left: resume stopped daemons, unmount, remove the work directory.
  for m in "$W"/n*/mnt; do
    [ -d "$m" ] || continue
    pid=$("$BIN" stats "$m" --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null || true)
    [ -n "$pid" ] && kill -CONT "$pid" 2>/dev/null || true
    fusermount3 -uz "$m" 2>/dev/null || true
  done
  for d in "$W"/n*/disk; do
    # KEEP: the daemon's log outlives its tmpfs cache disk.
    [ -z "${KEEP:-}" ] || cp "$d/cache/dyadfs.log" "$d/../dyadfs.log" 2>/dev/null || true
    mountpoint -q "$d" && umount -l "$d" || true
  done
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
export UCX_TLS=tcp UCX_NET_DEVICES=lo BIN W
python3 scripts/soak.py
