#!/usr/bin/env bash
# Producer -> consumer hand-off on managed directories (the design card's `dyadfs mount /dyad
# --ssd /nvme`), side by side in one run (medians of RUNS runs): 2 producers on nodes 0 and 1
# each write N files of SIZE bytes as fast as they can, and 2 consumers on nodes 2 and 3 (started
# first) open each as soon as it exists and read it whole:
#   (a) dyadfs: 4 daemons (2 racks, this tree's build or DYADFS_BIN), mounted with --wait: a
#       consumer's open waits until the producer's close has published the file;
#   (b) a plain directory on the same disk (the anchor: what a shared directory costs at best,
#       with no network): producers write a temporary name and rename it, consumers poll for the
#       name every millisecond.
# Reports files/s (all files, first close to last open) and the latency from the producer's
# close to the consumer's open returning, p50 and p99 over every file of the run.
# Also the split of that latency (close, queueing, wake-up and open, read: see stats below).
# PRODUCER=--shutil or --cp: dyadfs's producers copy each file in with shutil.copy or cp (the
# whole copy counts as the close); the plain directory's keep renaming.
# PACE_MS=N: each producer waits N ms after each file, a stream the consumers keep up with (as
# they do not with 256 KiB files, or with producers whose close is quick): then the latency is
# the hand-off's own, not a queue behind the consumers.
# BINS lists dyadfs builds to compare (e.g. two commits'), interleaved run by run with each
# other and the plain directory.
# TRACE_DIR=DIR: each daemon writes `--trace DIR/<build>-<run>/node<i>.json` and the producers'
# and consumers' timings go beside (read them with scripts/handoff_tail.py DIR: where the slow
# hand-offs spent their time).
# Needs root. Usage: scripts/bench_handoff.sh   (env: RUNS (5), N (500), SIZE (262144), PRODUCER,
# BINS, PACE_MS, TRACE_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-5} N=${N:-500} SIZE=${SIZE:-262144}
export UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
if [ -z "${BINS:-}" ]; then build_dyadfs; BINS=$BIN; fi
read -r -a BINS <<< "$BINS"
W=$(mktemp -d /var/tmp/dyadfs-handoff-bench.XXXX)
cleanup() {
  unmount_mounted "$W"/{0,1,2,3}/mnt
  rm -rf "$W"
}
trap cleanup EXIT
job_secret "$W/secret"
PORT=$((9000 + RANDOM % 1000))
for i in 0 1 2 3; do printf '%d 127.0.0.1:%d r%d\n' $i $((PORT + i)) $((i / 2)); done > "$W/peers"
PY=${PYTHON:-python3}
# stats FILE...: one run from the producers' and consumers' logs: "files/s p50_ms p99_ms", then
# the split of the latency, p50 and p99 each (ms): the producer's close (seal, checksum, publish);
# queueing (the consumer asked for the file only after its close returned: it was still busy with
# the one before); the wake-up and open (from the later of the close's return and the consumer's
# open call to its return); the read (the pull of the bytes).
stats() {
  "$PY" - "$@" <<'PY'
import json, sys
p0, p1, c0, c1 = (json.load(open(f)) for f in sys.argv[1:5])
pairs = [(p, c) for ps, cs in ((p0, c0), (p1, c1)) for p, c in zip(ps, cs)]
span = max(c0[-1][1], c1[-1][1]) - min(p0[0][0], p1[0][0])
def q(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))]
parts = [
    [1000 * (c[1] - p[0]) for p, c in pairs],
    [1000 * (p[1] - p[0]) for p, c in pairs],
    [1000 * max(0.0, c[0] - p[1]) for p, c in pairs],
    [1000 * (c[1] - max(p[1], c[0])) for p, c in pairs],
    [1000 * (c[2] - c[1]) for p, c in pairs],
]
cols = [f"{len(pairs) / span:.1f}"]
for xs in parts:
    cols += [f"{q(xs, 0.5):.2f}", f"{q(xs, 0.99):.2f}"]
print(" ".join(cols))
PY
}
# run KIND [BIN]: one hand-off through managed mounts of dyadfs build BIN ("dyadfs") or a plain
# directory ("plain"); its line goes to $W/KIND.txt ($W/dyadfs-I.txt for the I-th of BINS).
run() {
  local kind=$1 out dirs=() BIN=${2:-} key=$1
  [ -z "${3:-}" ] || key=$kind-$3
  out=$W/logs-$kind; rm -rf "$out"; mkdir -p "$out"
  if [ "$kind" = dyadfs ]; then
    for i in 0 1 2 3; do
      rm -rf "$W/$i/ssd"; mkdir -p "$W/$i/mnt"
      traced=()
      [ -z "${TRACE_DIR:-}" ] || { mkdir -p "$TRACE_DIR/$key-$RUN"; traced=(--trace "$TRACE_DIR/$key-$RUN/node$i.json"); }
      "$BIN" mount "$W/$i/mnt" --ssd "$W/$i/ssd" --node-id "$i" --peers "$W/peers" --wait 60s "${traced[@]}"
    done
    mkdir "$W/0/mnt/run"
    until [ -d "$W/3/mnt/run" ] && [ -d "$W/2/mnt/run" ] && [ -d "$W/1/mnt/run" ]; do sleep 0.05; done
    for i in 0 1 2 3; do dirs+=("$W/$i/mnt/run"); done
    pflag=${PRODUCER:-} cflag=""
  else
    rm -rf "$W/plain"; mkdir -p "$W/plain"
    dirs=("$W/plain" "$W/plain" "$W/plain" "$W/plain")
    pflag=--rename cflag=--poll
  fi
  "$PY" scripts/handoff.py consume "${dirs[2]}" 0 "$N" "$SIZE" "$out/c0" $cflag &
  local c0=$!
  "$PY" scripts/handoff.py consume "${dirs[3]}" 1 "$N" "$SIZE" "$out/c1" $cflag &
  local c1=$!
  sleep 0.3
  "$PY" scripts/handoff.py produce "${dirs[0]}" 0 "$N" "$SIZE" "$out/p0" $pflag &
  local p0=$!
  "$PY" scripts/handoff.py produce "${dirs[1]}" 1 "$N" "$SIZE" "$out/p1" $pflag
  wait $p0 $c0 $c1
  stats "$out/p0" "$out/p1" "$out/c0" "$out/c1" >> "$W/$key.txt"
  [ -z "${TRACE_DIR:-}" ] || [ "$kind" != dyadfs ] || cp "$out"/{p0,p1,c0,c1} "$TRACE_DIR/$key-$RUN/"
  if [ "$kind" = dyadfs ]; then
    for i in 0 1 2 3; do fusermount3 -u "$W/$i/mnt"; done
    sleep 0.3
  fi
}
for RUN in $(seq "$RUNS"); do
  for i in "${!BINS[@]}"; do run dyadfs "${BINS[$i]}" "$i"; done
  run plain
done
printf '%d + %d files of %d bytes handed from producers on 2 nodes to consumers on 2 others, medians of %d runs%s%s\n' \
  "$N" "$N" "$SIZE" "$RUNS" "${PRODUCER:+ (dyadfs producers: ${PRODUCER#--})}" \
  "${PACE_MS:+, producers pausing $PACE_MS ms after each file}"
for i in "${!BINS[@]}"; do
  [ "${#BINS[@]}" -eq 1 ] || echo "  B$i = ${BINS[$i]}"
done
keys=()
for i in "${!BINS[@]}"; do keys+=("dyadfs-$i"); done
for k in "${keys[@]}" plain; do
  col() { cut -d' ' -f"$1" "$W/$k.txt"; }
  what="(b) plain directory, rename + 1 ms polling"
  if [ "$k" != plain ]; then
    what="(a) dyadfs, 4 managed mounts, --wait"
    [ "${#BINS[@]}" -eq 1 ] || what+=", B${k#dyadfs-}"
  fi
  printf '  %-46s %8.1f files/s  close->open p50 %6.2f ms  p99 %7.2f ms\n' "$what" \
    "$(col 1 | median)" "$(col 2 | median)" "$(col 3 | median)"
  printf '      runs: files/s %s| p50 %s| p99 %s\n' "$(col 1 | tr '\n' ' ')" "$(col 2 | tr '\n' ' ')" "$(col 3 | tr '\n' ' ')"
  printf '      split, medians of p50/p99 (ms): close %s/%s  queued %s/%s  wake-up+open %s/%s  read %s/%s\n' \
    "$(col 4 | median)" "$(col 5 | median)" "$(col 6 | median)" "$(col 7 | median)" \
    "$(col 8 | median)" "$(col 9 | median)" "$(col 10 | median)" "$(col 11 | median)"
done
