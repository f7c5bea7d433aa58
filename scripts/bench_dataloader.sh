#!/usr/bin/env bash
# The DataLoader comparison of issue 49 on one machine, offline: an unmodified PyTorch input
# pipeline (scripts/workload/train.py: np.load in __getitem__, DistributedSampler with set_epoch,
# batch 32, WORKERS workers) as 4 ranks at once, each through its own node's mount of a 4-node
# dyadfs cluster on 127.0.0.1 (2 racks), against the same 4 ranks reading a local copy on the
# same disk. EPOCHS epochs per run, the page cache dropped before each; dyadfs starts every run
# with empty caches, so epoch 1 fills from the shared directory and later epochs pull from peers
# or hit their own node's cache. Configurations alternate run by run; every epoch of every run
# is printed, then medians of the ratio to the local copy's same epoch, with the 4 daemons' CPU
# per sample (their threads' schedstat).
# Unlike scripts/workload.sh it installs nothing, throttles nothing and uses no namespaces, so
# it runs where only python3 with torch and numpy is (a lent machine with many cores): it
# measures the later epochs, not epoch 1 against a slow shared file system.
# CONFIGS lists the configurations alternated (default "local dyadfs"); "fusefloor" adds the
# same ranks reading the local copy through examples/fuse_floor.rs, one mount per rank, writable
# as dyadfs's default mount is: the kernel's FUSE requests of each sample (LOOKUP, OPEN, IOCTL,
# GETATTR, RELEASE) answered by a daemon that does nothing else, the floor under dyadfs's hits,
# and what those requests alone cost the epoch on this machine.
# Needs root (mounts, drop_caches). Usage: scripts/bench_dataloader.sh (env: RUNS, FILES, SIZE,
# EPOCHS, WORKERS, PY (python3 with torch), MOUNT_ARGS, DYADFS_BIN, REQUESTS, THREADS, CONFIGS,
# STATS)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-3} FILES=${FILES:-4096} SIZE=${SIZE:-262144} EPOCHS=${EPOCHS:-3} WORKERS=${WORKERS:-4}
PY=${PY:-python3}
NODES=4
"$PY" -c 'import torch, numpy' || { echo "$PY has no torch or numpy (set PY)" >&2; exit 1; }
CONFIGS=${CONFIGS:-local dyadfs}
case " $CONFIGS " in *" local "*) ;; *) echo "CONFIGS must list local (the ratios are to it)" >&2; exit 2 ;; esac
if [ -n "${DYADFS_BIN:-}" ]; then BIN=$DYADFS_BIN; else cargo build --release --quiet; BIN=$PWD/target/release/dyadfs; fi
case " $CONFIGS " in *" fusefloor "*) build_examples fuse_floor ;; esac
W=$(mktemp -d /var/tmp/dyadfs-dataloader.XXXX)
cleanup() {
  for i in $(seq 0 $((NODES - 1))); do unmount_mounted "$W/n$i/mnt"; unmount_mounted "$W/f$i/mnt"; done
  [ -z "${FUSE_TRACEFS_MOUNTED:-}" ] || umount "$FUSE_TRACE"
  rm -rf "$W"
}
trap cleanup EXIT
job_secret "$W/secret"
"$PY" scripts/workload/dataset.py "$W/backing/dl" "$FILES" "$SIZE"
mkdir -p "$W/local"; cp -r "$W/backing/dl" "$W/local/"
PORT=$((9000 + RANDOM % 1000))
for i in $(seq 0 $((NODES - 1))); do
  echo "$i 127.0.0.1:$((PORT + i)) r$((i / 2))"
done > "$W/peers"
# REQUESTS=1: the FUSE requests the kernel sent per sample, by opcode, printed for each dyadfs
# epoch (the fuse:fuse_request_send tracepoint).
[ "${REQUESTS:-0}" != 1 ] || fuse_trace_ready
trace_on() { [ "${REQUESTS:-0}" != 1 ] || fuse_trace_start; }
trace_off() {
  [ "${REQUESTS:-0}" = 1 ] || return 0
  echo "    FUSE requests per sample: $(fuse_trace_stop "$1")"
}
daemons_cpu_ms() {
  local p s=0
  for p in $DAEMONS; do s=$(awk -v a="$s" -v b="$(threads_cpu_ms "$p")" 'BEGIN {print a + b}'); done
  echo "$s"
}
# THREADS=1: each dyadfs (or fusefloor) epoch's daemon CPU by thread name (the 4 daemons'
# threads of one name together), per sample.
thread_cpu() {
  local p t c s
  for p in $DAEMONS; do
    # (A thread that ends between the listing and the read is left out.)
    for t in /proc/"$p"/task/*; do
      c=$(tr ' ' _ < "$t/comm" 2>/dev/null) && s=$(awk '{print $1}' "$t/schedstat" 2>/dev/null) &&
        echo "$c $s"
    done
  done | awk '{s[$1] += $2} END {for (k in s) print k, s[k]}' | sort
}
# STATS=1: each dyadfs epoch's counters of `dyadfs stats --json` that moved, the 4 nodes'
# together, per sample (local hits, pulls, refused pulls, GETATTRs, evictions...).
counters() {
  local i
  for i in $(seq 0 $((NODES - 1))); do "$BIN" stats "$W/n$i/mnt" --json; echo; done | "$PY" -c '
import json, sys
s = {}
for line in sys.stdin:
    if line.strip():
        for k, v in json.loads(line).items():
            if isinstance(v, int) and not isinstance(v, bool):
                s[k] = s.get(k, 0) + v
print(json.dumps(s))'
}
counters_moved() {
  "$PY" -c '
import json, sys
a, b, n = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
gauges = {"cached_bytes", "cached_files", "cache_segments", "capacity_bytes", "inodes",
          "open_files", "kept_files", "partial_chunks", "pid", "node_id", "node_rank", "members",
          "home_rack_files", "home_global_files", "home_names", "members_down"}
moved = [f"{k} {(b[k] - a.get(k, 0)) / n:.2f}" for k in sorted(b)
         if k not in gauges and b[k] != a.get(k, 0)]
print("    counters per sample: " + "  ".join(moved))' "$1" "$2" "$3"
}
# snapshot FILE: the 4 nodes' counters now (`{}` but for dyadfs), read once at each end of an
# epoch for its locator round trips and, with STATS=1, every counter that moved.
snapshot() {
  if [ "$cfg" = dyadfs ]; then counters > "$1"; else echo '{}' > "$1"; fi
}
# locator_calls FILE: the locator round trips in a snapshot (`locator_calls`, summed; 0 but for
# dyadfs, whose snapshots alone hold counters).
locator_calls() {
  [ "$cfg" = dyadfs ] || { echo 0; return; }
  "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("locator_calls", 0))' "$1"
}
# epoch E ROOT_PATTERN: the 4 ranks, rank i reading ROOT_PATTERN with %d replaced by i; prints
# the slowest rank's seconds and the samples read.
epoch() {
  local i barrier
  barrier=$(mktemp -d "$W/barrier.XXXX")
  for i in $(seq 0 $((NODES - 1))); do
    # shellcheck disable=SC2059 # the pattern is ours
    "$PY" scripts/workload/train.py --data "$(printf "$2" "$i")" --rank "$i" --world $NODES \
      --first-epoch "$1" --workers "$WORKERS" --barrier "$barrier" > "$W/rank$i.json" &
  done
  wait
  cat "$W"/rank*.json | "$PY" -c '
import json, sys
r = [json.loads(l) for l in sys.stdin]
print(max(x["seconds"] for x in r), sum(x["samples"] for x in r))'
}
: > "$W/results"
for r in $(seq "$RUNS"); do
  for cfg in $CONFIGS; do
    DAEMONS=
    if [ "$cfg" = fusefloor ]; then
      for i in $(seq 0 $((NODES - 1))); do
        mkdir -p "$W/f$i/mnt"
        target/release/examples/fuse_floor "$W/local/dl" "$W/f$i/mnt" --rw 2> "$W/f$i/log" &
        DAEMONS+=" $!"
      done
      for i in $(seq 0 $((NODES - 1))); do
        for _ in $(seq 100); do mountpoint -q "$W/f$i/mnt" && break; sleep 0.05; done
        mountpoint -q "$W/f$i/mnt" || { cat "$W/f$i/log" >&2; exit 1; }
      done
    elif [ "$cfg" = dyadfs ]; then
      for i in $(seq 0 $((NODES - 1))); do
        rm -rf "$W/n$i"; mkdir -p "$W/n$i/mnt" "$W/n$i/ssd"
        # shellcheck disable=SC2086 # MOUNT_ARGS is a list of options
        "$BIN" mount "$W/n$i/mnt" --ssd "$W/n$i/ssd" --backing "$W/backing" --node-id "$i" \
          --peers "$W/peers" ${MOUNT_ARGS:-}
        DAEMONS+=" $(pgrep -f -- " mount $W/n$i/mnt ")"
      done
    fi
    for e in $(seq "$EPOCHS"); do
      drop
      c0=$([ -z "$DAEMONS" ] && echo 0 || daemons_cpu_ms)
      snapshot "$W/counters0"
      [ "${THREADS:-0}" != 1 ] || [ -z "$DAEMONS" ] || thread_cpu > "$W/threads0"
      if [ "$cfg" = local ]; then read -r secs n < <(epoch "$e" "$W/local/dl")
      elif [ "$cfg" = fusefloor ]; then trace_on; read -r secs n < <(epoch "$e" "$W/f%d/mnt")
      else trace_on; read -r secs n < <(epoch "$e" "$W/n%d/mnt/dl"); fi
      c1=$([ -z "$DAEMONS" ] && echo 0 || daemons_cpu_ms)
      snapshot "$W/counters1"
      l0=$(locator_calls "$W/counters0") l1=$(locator_calls "$W/counters1")
      us=$(awk -v a="$c0" -v b="$c1" -v n="$n" 'BEGIN {printf "%.0f", (b - a) * 1000 / n}')
      printf 'run %d %-6s epoch %d  %6.2f s  %d samples  daemons %4d us/sample  %.2f locator round trips/sample\n' \
        "$r" "$cfg" "$e" "$secs" "$n" "$us" "$(awk -v a="$l0" -v b="$l1" -v n="$n" 'BEGIN {print (b - a) / n}')"
      echo "$r $cfg $e $secs $us" >> "$W/results"
      [ "$cfg" = local ] || trace_off "$n"
      if [ "${STATS:-0}" = 1 ] && [ "$cfg" = dyadfs ]; then
        counters_moved "$W/counters0" "$W/counters1" "$n"
      fi
      if [ "${THREADS:-0}" = 1 ] && [ -n "$DAEMONS" ]; then
        thread_cpu > "$W/threads1"
        join -a 2 "$W/threads0" "$W/threads1" | awk -v n="$n" 'NF == 2 {$3 = $2; $2 = 0}
          {d = ($3 - $2) / 1000 / n; if (d >= 1) printf "%s %.0f  ", $1, d}' |
          sed 's/^/    daemon threads, us per sample: /'; echo
      fi
    done
    if [ "$cfg" = dyadfs ]; then
      for i in $(seq 0 $((NODES - 1))); do fusermount3 -u "$W/n$i/mnt"; done
      wait_daemons_gone "$W"
    elif [ "$cfg" = fusefloor ]; then
      for i in $(seq 0 $((NODES - 1))); do fusermount3 -u "$W/f$i/mnt"; done
      # shellcheck disable=SC2086 # a list of pids
      wait $DAEMONS || true
    fi
  done
done
printf '%d x %d bytes, %d ranks x %d workers, medians of %d runs (ratio: dyadfs / local copy,\n' \
  "$FILES" "$SIZE" $NODES "$WORKERS" "$RUNS"
echo "the same run and epoch; every ratio listed):"
for cfg in $CONFIGS; do
  [ "$cfg" != local ] || continue
  for e in $(seq "$EPOCHS"); do
    awk -v e="$e" -v cfg="$cfg" '$3 == e {t[$1 " " $2] = $4; c[$1 " " $2] = $5}
      END {for (k in t) {split(k, K, " "); if (K[2] == cfg) print t[k] / t[K[1] " local"], c[k]}}' \
      "$W/results" | sort -g > "$W/ratios"
    printf '  %-9s epoch %d: %.2fx the local copy (%s), daemons %s us/sample\n' "$cfg" "$e" \
      "$(awk '{print $1}' "$W/ratios" | median)" "$(awk '{printf "%.2f ", $1}' "$W/ratios")" \
      "$(awk '{print $2}' "$W/ratios" | median)"
  done
done
