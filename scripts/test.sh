#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs every test.
# Integration tests mount for real, so this needs root (CAP_SYS_ADMIN) and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# fuse-tests: the integration tests that mount and run daemons (all of them, here).
cargo test --all-targets --features fuse-tests "$@"
# The cache's chunk claims under shuttle's randomized scheduler (a build of their own: shuttle's
# primitives replace std's there, so only these tests run in it).
cargo test --features shuttle --lib cache::chunks::shuttle_tests
