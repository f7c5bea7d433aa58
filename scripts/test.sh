#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs every test.
# Integration tests mount for real, so this needs root (CAP_SYS_ADMIN) and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# The mounts' FUSE transport (`--fuse-transport auto`): /dev/fuse for the first run, then the
# kernel's io_uring queues where the kernel has them (auto takes the ring when
# /sys/module/fuse/parameters/enable_uring is Y). The suite sets the parameter for each run and
# puts it back as it found it.
URING=/sys/module/fuse/parameters/enable_uring
was=$(cat "$URING" 2>/dev/null || true)
restore() { if [ -n "$was" ]; then echo "$was" > "$URING"; fi; }
trap restore EXIT
if [ -n "$was" ]; then echo N > "$URING"; fi
# The wheel tests/wheel.rs installs as a plain user.
scripts/build-wheel.sh
# fuse-tests: the integration tests that mount and run daemons (all of them, here).
cargo test --all-targets --features fuse-tests "$@"
if [ -n "$was" ]; then
  echo Y > "$URING"
  echo "== the integration tests again, FUSE requests by io_uring"
  cargo test --features fuse-tests --test '*' "$@"
  restore
else
  echo "== this kernel has no FUSE over io_uring: the ring run is skipped"
fi
# The cache's chunk claims and its log's appends under shuttle's randomized scheduler (a build of
# their own: shuttle's primitives replace std's there, so only these tests run in it).
cargo test --features shuttle --lib shuttle_tests
