#!/usr/bin/env bash
# The README's demo command: builds dyadfs, generates a dataset, mounts it and reads it for
# several epochs like a DataLoader (shuffled, 4 reader processes), printing per epoch where the
# bytes came from. Cleans up after itself. Needs root (FUSE mount) and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release --quiet
exec python3 scripts/demo.py --dyadfs target/release/dyadfs "$@"
