#!/usr/bin/env bash
# A producer's close, side by side in one run: 2 daemons of a managed directory (this tree's
# release build, or each binary of BINS, interleaved run by run), a Python producer on node 0
# writing N files of SIZE bytes with open/write/close; per run the close's p50 and p90 (the
# producer's own clock) and the daemon's median `seal` and `publish` spans (its --trace), and
# the medians of RUNS runs. The close is what a consumer on another node waits behind.
# PY=<python with torch> IMPORT=torch: the producer imports torch first, as a training job's
# checkpointing or in-situ producer would (hundreds of mappings, which a close looks through:
# caller::held_elsewhere). CACHE_FS=ext4: both caches on a fresh journaled ext4 image (the
# 2-vCPU VM's own ext4, without a journal, makes every new file's inode slow to allocate).
# CHILD=1: the producer has a child process alive while it writes (a `sleep`, as a job with a
# helper process or a DataLoader's workers has), so each close looks at its children too.
# Needs root. Usage: scripts/bench_close.sh   (env: RUNS (3), N (300), SIZE (262144), BINS, PY,
# IMPORT, CACHE_FS, CHILD)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-3} N=${N:-300} SIZE=${SIZE:-262144}
if [ -z "${BINS:-}" ]; then build_dyadfs; BINS=$BIN; fi
W=$(mktemp -d /var/tmp/dyadfs-close-bench.XXXX)
cleanup() {
  unmount_mounted "$W"/m0 "$W"/m1
  wait_daemons_gone "$W"
  if mountpoint -q "$W/img"; then umount "$W/img"; fi
  rm -rf "$W"
}
trap cleanup EXIT
C=$W
if [ "${CACHE_FS:-}" = ext4 ]; then
  mkdir "$W/img"; C=$W/img
  truncate -s $((N * SIZE * RUNS * 4 + (1 << 30))) "$W/cache.img"
  mkfs.ext4 -q -F "$W/cache.img"
  mount -o loop "$W/cache.img" "$W/img"
fi
job_secret "$W/secret"
PORT=$((9000 + RANDOM % 1000))
printf '0 127.0.0.1:%d r0\n1 127.0.0.1:%d r0\n' "$PORT" $((PORT + 1)) > "$W/peers"
# run BIN: one run; appends "close_p50 close_p90 seal publish" (ms, ms, us, us) to $W/<bin>.txt
run() {
  local bin=$1 out=$W/$(echo "$1" | tr / _).txt
  rm -rf "$W"/m0 "$W"/m1 "$C"/s0 "$C"/s1 "$W/trace.json"
  mkdir -p "$W"/m0 "$W"/m1
  "$bin" mount "$W/m0" --ssd "$C/s0" --node-id 0 --peers "$W/peers" --trace "$W/trace.json"
  "$bin" mount "$W/m1" --ssd "$C/s1" --node-id 1 --peers "$W/peers"
  mkdir "$W/m0/run"
  local close
  close=$("${PY:-python3}" - "$W/m0/run" "$N" "$SIZE" "${IMPORT:-}" "${CHILD:-}" <<'PY'
import importlib, os, subprocess, sys, time
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if sys.argv[4]:
    importlib.import_module(sys.argv[4])
child = subprocess.Popen(["sleep", "600"]) if sys.argv[5] else None
data, ts = os.urandom(size), []
for i in range(n):
    f = open(f"{d}/f{i}", "wb"); f.write(data)
    t = time.perf_counter(); f.close(); ts.append(time.perf_counter() - t)
if child:
    child.kill()
    child.wait()
ts.sort()
print(f"{ts[n // 2] * 1e3:.3f} {ts[n * 9 // 10] * 1e3:.3f}")
PY
)
  unmount_mounted "$W"/m0 "$W"/m1
  sleep 0.5
  wait_daemons_gone "$W"
  local spans
  spans=$(python3 - "$W/trace.json" <<'PY'
import json, statistics, sys
text = open(sys.argv[1]).read().rstrip().rstrip(",")
events = json.loads(text if text.endswith("]") else text + "]")
dur = lambda name: statistics.median([e["dur"] for e in events if e.get("name") == name] or [0])
print(f"{dur('seal'):.0f} {dur('publish'):.0f}")
PY
)
  echo "$close $spans" >> "$out"
  printf '  %-40s close p50 %s ms p90 %s ms  seal %s us  publish %s us\n' "$bin" $close $spans
}
echo "$N closes of $SIZE-byte files on node 0 of 2${IMPORT:+, the producer importing $IMPORT}${CHILD:+, the producer with a child}${CACHE_FS:+, caches on a $CACHE_FS image}, every run:"
for _ in $(seq "$RUNS"); do
  for b in $BINS; do run "$b"; done
done
echo "medians of $RUNS runs:"
for b in $BINS; do
  f=$W/$(echo "$b" | tr / _).txt
  col() { cut -d' ' -f"$1" "$f" | median; }
  printf '  %-40s close p50 %s ms p90 %s ms  seal %s us  publish %s us\n' "$b" \
    "$(col 1)" "$(col 2)" "$(col 3)" "$(col 4)"
done
