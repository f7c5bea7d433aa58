#!/usr/bin/env bash
# The README's demo command: builds dyadfs, generates a dataset on a slow "shared file system"
# (an ext4 image on a loop device whose reads are throttled to DEMO_MIBS MiB/s with the cgroup v1
# blkio controller, as the workload harness does; unthrottled where that controller is absent),
# mounts it on 4 daemons (2 racks, on 127.0.0.1) and reads a different shard on each node every
# epoch, then each node's last shard again, printing per epoch and node where the bytes came
# from and a line per tier. Cleans up after itself. Needs root and /dev/fuse.
# Usage: scripts/demo.sh [demo.py options, e.g. --files 512]   (env: DEMO_MIBS, default 40)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release --quiet
. scripts/lib/common.sh
. scripts/lib/slow-fs.sh
W=$(mktemp -d /var/tmp/dyadfs-demo.XXXX)
cleanup() {
  set +e
  for m in "$W"/node*/dyad; do unmount_mounted "$m"; done
  slow_fs_stop
  rm -rf "$W"
}
trap cleanup EXIT
MIBS=${DEMO_MIBS:-40}
if [ -d /sys/fs/cgroup/blkio ]; then
  echo "the shared FS: ext4 on a loop device, reads throttled to $MIBS MiB/s"
  slow_fs_start "$W/shared-fs" 2G $((MIBS << 20))
else
  echo "no cgroup v1 blkio controller here: the shared FS is a plain, unthrottled directory" >&2
  mkdir -p "$W/shared-fs"
fi
python3 scripts/demo.py --dyadfs target/release/dyadfs --dir "$W" --backing "$W/shared-fs" \
  --drop-caches "$@"
