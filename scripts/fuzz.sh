#!/usr/bin/env bash
# Fuzzes the decoders of untrusted bytes with cargo fuzz (libFuzzer, nightly toolchain):
#   wire_decode     control frames from the network
#   journal_decode  the cache's header log after a crash or a bad disk
#   cache_header    one cache entry header
#   hello           a pull connection's hello (UCX blobs) and sealed frames
# Each target runs FUZZ_SECONDS seconds (default 60) from the seeds in fixtures/fuzz/TARGET; an input
# that crashes one is copied into fixtures/fuzz/TARGET/, which the normal test run replays
# (tests/fuzz_regressions.rs). Prints executions and crashes per target.
# Usage: scripts/fuzz.sh [TARGET...]   (not in CI: it needs nightly and minutes of CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
SECONDS_PER_TARGET=${FUZZ_SECONDS:-60}
# The targets link dyadfs and so UCX, which scripts/install-deps.sh puts in .tools/ucx, on no
# loader path (the project's own binaries carry it as their rpath; build.rs).
LD_LIBRARY_PATH="$(ucx_home)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(wire_decode journal_decode cache_header hello)
status=0
for t in "${TARGETS[@]}"; do
  corpus=fuzz/corpus/$t
  mkdir -p "$corpus" "fuzz/artifacts/$t"
  cp -n fixtures/fuzz/"$t"/* "$corpus"/ 2>/dev/null || true
  log=fuzz/artifacts/$t.log
  echo "== $t: ${SECONDS_PER_TARGET}s" >&2
  if cargo +nightly fuzz run "$t" "$corpus" -- -max_total_time="$SECONDS_PER_TARGET" \
       -print_final_stats=1 > "$log" 2>&1; then
    crashes=0
  else
    crashes=$(find "fuzz/artifacts/$t" -type f | wc -l)
    status=1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  echo "$t: $execs executions, $crashes crashes (log $log)"
  for f in "fuzz/artifacts/$t"/*; do
    [ -f "$f" ] || continue
    cp "$f" "fixtures/fuzz/$t/regression-$(basename "$f")"
    echo "  kept $f as fixtures/fuzz/$t/regression-$(basename "$f")"
  done
done
exit $status
