#!/usr/bin/env bash
# The README's demo command: builds dyadfs, generates a dataset, mounts it on 4 daemons (2 racks,
# UCX over tcp on loopback) and reads a different shard on each node every epoch, printing per
# epoch and node where the bytes came from. Cleans up after itself. Needs root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release --quiet
exec python3 scripts/demo.py --dyadfs target/release/dyadfs "$@"
