#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs every test.
# Integration tests mount for real, so this needs root (CAP_SYS_ADMIN) and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo test --all-targets "$@"
