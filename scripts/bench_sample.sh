#!/usr/bin/env bash
# The ledger of one sample (issue 49): what a DataLoader-like reader's sample costs the daemons,
# request by request, for the three paths a sample takes. Two nodes on 127.0.0.1 (A, B, racks of
# their own), FILES files of SIZE bytes on the shared directory, read whole in shuffled order by
# 4 Python processes with buffered `open(path, "rb").read()` (as `torch.utils.data` workers do):
#   fill  A reads them: each is fetched from the shared FS into A's cache;
#   pull  B reads them: each is located, pulled from A and stored in B's cache;
#   hit   B reads them again after the page cache (and the kernel's dentries) was dropped.
# Per sample and phase it prints the FUSE requests the kernel sent (by opcode, from the
# `fuse:fuse_request_send` tracepoint), both daemons' CPU and context switches, and, in a second
# pass over other files with `strace -c -f` attached to both daemons (which slows them, so its
# CPU is not counted), every system call the daemons made. PERF=1 adds `perf record -g` of B
# over the pull and hit phases of run 1 and prints where B's CPU went (top symbols, children);
# PERF=dwarf records DWARF call graphs instead (release builds keep no frame pointers) and also
# prints each of the daemon's functions with its callees' share; PERF_OF=A records the holder
# instead of B; PERF_PHASES lists the phases recorded (default "pull hit"; "fill" with PERF_OF=A
# shows a fill); PERF_EVENT=E records event E instead of CPU cycles (e.g.
# syscalls:sys_enter_futex: which functions make the daemon's futex calls). RUNS passes of the
# first kind, whose CPU is printed run by run; one strace pass. MOUNT_ARGS: extra options for
# both mounts. RESTART_A=1 remounts A after each fill (and waits SETTLE seconds, default 2): its
# serves are then each file's first since a restart (a reloaded cache entry's data file is
# checked at its first open), as in scripts/bench_small_pull.sh, whose holder is remounted
# between the builds it alternates.
# Both caches are on one fresh journaled ext4 loop image (CACHE_FS=ext4, the default; empty: the
# directory's own file system, which on the 2-vCPU VM is ext4 without a journal, where every new
# cache file's inode allocation scans for recently deleted inodes).
# Each phase also splits both daemons' CPU by thread name (FUSE threads, the runtime, the
# publisher, the holder's serving threads), per file.
# Needs root (tracefs, strace -p, drop_caches). Usage: scripts/bench_sample.sh (env: RUNS,
# FILES, SIZE, MOUNT_ARGS, DYADFS_BIN, RACKS, PERF, PERF_OF, PERF_SAVE, RESTART_A, SETTLE;
# STRACE=0 leaves out the strace pass)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-3} FILES=${FILES:-2048} SIZE=${SIZE:-262144}
build_dyadfs
fuse_trace_ready
W=$(mktemp -d /var/tmp/dyadfs-sample-bench.XXXX)
cleanup() {
  echo 0 > "$FUSE_TRACE/events/fuse/fuse_request_send/enable" 2>/dev/null || true
  unmount_mounted "$W"/{a,b}/mnt
  wait_daemons_gone "$W"
  for m in "$W"/{a,b}/ssd "$W/img"; do if mountpoint -q "$m"; then umount "$m"; fi; done
  rm -rf "$W"
  [ -z "${FUSE_TRACEFS_MOUNTED:-}" ] || umount "$FUSE_TRACE"
}
trap cleanup EXIT
mkdir -p "$W"/backing "$W"/{a,b}/{mnt,ssd}
if [ "${CACHE_FS-ext4}" = ext4 ]; then
  mkdir "$W/img"
  truncate -s $((FILES * SIZE * (RUNS + 1) * 3 + (1 << 30))) "$W/cache.img"
  mkfs.ext4 -q -F "$W/cache.img"
  mount -o loop "$W/cache.img" "$W/img"
  for n in a b; do mkdir "$W/img/$n"; mount --bind "$W/img/$n" "$W/$n/ssd"; done
fi
job_secret "$W/secret"
# One set of files per pass (RUNS counted passes and the strace pass), each its own directory.
python3 - "$W/backing" "$FILES" "$SIZE" "$((RUNS + 1))" <<'PY'
import os, sys
root, files, size, sets = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for s in range(sets):
    os.makedirs(os.path.join(root, f"set{s}"))
    for i in range(files):
        with open(os.path.join(root, f"set{s}", f"{i:05}.bin"), "wb") as f:
            f.write(os.urandom(size))
PY
PORT=$((9000 + RANDOM % 1000))
# RACKS=1 puts A and B in one rack (B then learns A's holders in bulk: holder hints).
rack_b=r1; [ "${RACKS:-2}" != 1 ] || rack_b=r0
printf '0 127.0.0.1:%d r0\n1 127.0.0.1:%d %s\n' $PORT $((PORT + 1)) $rack_b > "$W/peers"
mount_node a 0
mount_node b 1
A=$(pgrep -f -- " mount $W/a/mnt ") B=$(pgrep -f -- " mount $W/b/mnt ")
# restart_a: with RESTART_A=1, A is unmounted and mounted again over its cache, then left SETTLE
# seconds (what its start costs is not counted per file).
restart_a() {
  [ "${RESTART_A:-0}" = 1 ] || return 0
  unmount_mounted "$W/a/mnt"
  local _
  for _ in $(seq 100); do kill -0 "$A" 2> /dev/null || break; sleep 0.1; done
  mount_node a 0
  A=$(pgrep -f -- " mount $W/a/mnt ")
  sleep "${SETTLE:-2}"
}
# Both nodes' locator round trips and shared-FS stats so far: "CALLS STATS".
round_trips() {
  local s=0 f=0 m
  for m in "$W"/{a,b}/mnt; do
    read -r c b < <("$BIN" stats "$m" --json | python3 -c 'import json, sys; j = json.load(sys.stdin); print(j.get("locator_calls", 0), j.get("backing_stats", 0))')
    s=$((s + c)) f=$((f + b))
  done
  echo "$s $f"
}
# faults PID: the page faults (minor and major) of the process so far.
faults() { awk '{print $10 + $12}' "/proc/$1/stat"; }
# by_thread PID: each thread name's CPU so far (ns), summed over the threads of that name (a
# thread that ends while it is read is left out).
by_thread() {
  for t in /proc/"$1"/task/*; do
    { c=$(tr ' ' _ < "$t/comm") && n=$(awk '{print $1}' "$t/schedstat") && echo "$c $n"; } 2>/dev/null || true
  done | awk '{s[$1] += $2} END {for (k in s) print k, s[k]}' | sort
}
# thread_split BEFORE AFTER: the names that took at least 1 us per file between the two.
thread_split() {
  join -a 2 "$1" "$2" | awk -v n="$FILES" 'NF == 2 {$3 = $2; $2 = 0}
    {d = ($3 - $2) / 1000 / n; if (d >= 1) printf "%s %.0f  ", $1, d}'
}
# read_set MNT SET: the 4 readers over set SET through MNT, each its quarter of a shuffled order.
read_set() {
  python3 - "$1/set$2" <<'PY'
import os, random, sys
root = sys.argv[1]
names = sorted(os.listdir(root))
random.Random(7).shuffle(names)
kids = []
for q in range(4):
    pid = os.fork()
    if pid == 0:
        for n in names[q::4]:
            with open(os.path.join(root, n), "rb") as f:
                f.read()
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
PY
}
# The phase's reads: fill (A), pull (B), hit (B, after a drop) of set $2 (the listing that
# read_set makes goes with each phase: a DataLoader's dataset lists its directory once, first).
phase_mnt() { case $1 in fill) echo "$W/a/mnt" ;; *) echo "$W/b/mnt" ;; esac; }
for r in $(seq "$RUNS"); do
  s=$((r - 1))
  for ph in fill pull hit; do
    [ "$ph" != hit ] || sleep 0.5   # B's publishes trail its reads
    drop
    a0=$(threads_cpu_ms "$A") b0=$(threads_cpu_ms "$B") sa0=$(switches "$A") sb0=$(switches "$B")
    fa0=$(faults "$A") fb0=$(faults "$B")
    by_thread "$A" > "$W/ta0"; by_thread "$B" > "$W/tb0"
    l0=$(round_trips)
    fuse_trace_start
    if [ "${PERF:-0}" != 0 ] && [ "$r" = 1 ] && [[ " ${PERF_PHASES:-pull hit} " == *" $ph "* ]]; then
      # shellcheck disable=SC2046 # the call-graph option is one or two words
      perf record -q $([ "$PERF" = dwarf ] && echo "--call-graph dwarf,16384 -F 2000" || echo -g) \
        ${PERF_EVENT:+-e "$PERF_EVENT"} \
        -p "$([ "${PERF_OF:-B}" = A ] && echo "$A" || echo "$B")" -o "$W/perf.$ph" 2>/dev/null &
      pf=$!; sleep 0.5
    fi
    t0=$(now); read_set "$(phase_mnt $ph)" "$s"; t1=$(now)
    if [ -n "${pf:-}" ]; then kill -INT "$pf"; wait "$pf" || true; pf=; fi
    req=$(fuse_trace_stop "$FILES")
    a1=$(threads_cpu_ms "$A") b1=$(threads_cpu_ms "$B") sa1=$(switches "$A") sb1=$(switches "$B")
    fa1=$(faults "$A") fb1=$(faults "$B")
    l1=$(round_trips)
    awk -v ph=$ph -v r="$r" -v n="$FILES" -v t="$t0 $t1" -v a="$a0 $a1" -v b="$b0 $b1" \
      -v sa="$sa0 $sa1" -v sb="$sb0 $sb1" -v l="$l0 $l1" 'BEGIN {
      split(t, T, " "); split(a, A, " "); split(b, B, " "); split(sa, SA, " "); split(sb, SB, " ")
      split(l, L, " ")
      printf "run %d %-4s %6.0f files/s  CPU per file A %4.0f us B %4.0f us  switches A %.1f B %.1f  locator round trips %.2f  shared-FS stats %.2f\n",
        r, ph, n / (T[2] - T[1]), (A[2] - A[1]) * 1000 / n, (B[2] - B[1]) * 1000 / n,
        (SA[2] - SA[1]) / n, (SB[2] - SB[1]) / n, (L[3] - L[1]) / n, (L[4] - L[2]) / n }' | tee -a "$W/runs.txt"
    echo "  FUSE requests per file: $req"
    awk -v n="$FILES" -v a="$fa0 $fa1" -v b="$fb0 $fb1" 'BEGIN { split(a, A, " "); split(b, B, " ")
      printf "  page faults per file: A %.1f B %.1f\n", (A[2] - A[1]) / n, (B[2] - B[1]) / n }'
    by_thread "$A" > "$W/ta1"; by_thread "$B" > "$W/tb1"
    echo "  CPU per file by thread, us: B $(thread_split "$W/tb0" "$W/tb1")| A $(thread_split "$W/ta0" "$W/ta1")"
    awk -v ph=$ph -v n="$FILES" -v d="$a0 $a1 $b0 $b1" 'BEGIN {
      split(d, D, " "); printf "%s %.1f\n", ph, (D[2] - D[1] + D[4] - D[3]) * 1000 / n }' >> "$W/cpu.txt"
    [ "$ph" != fill ] || restart_a
  done
done
# What each FUSE request of a hit costs B alone, on set 0 (cached on B): one request many times
# and as little else as can be (the kernel's dentries and B's inodes kept between them).
one_kind() {
  python3 - "$W/b/mnt/set0" "$1" <<'PY'
import os, sys
root, kind = sys.argv[1], sys.argv[2]
names = sorted(os.listdir(root))
path = os.path.join(root, names[0])
if kind == "ioctl":            # Python's isatty on a buffered open: FUSE_IOCTL
    fd = os.open(path, os.O_RDONLY)
    for _ in range(10 * len(names)):
        os.isatty(fd)
    os.close(fd)
elif kind == "open":           # os.open + os.close of one cached file: OPEN and RELEASE
    for _ in range(10 * len(names)):
        os.close(os.open(path, os.O_RDONLY))
elif kind == "lookup":         # a stat of every name after the dentries were dropped: LOOKUP
    for n in names:
        os.stat(os.path.join(root, n))
PY
}
echo "a hit's requests on B alone (set 0, $FILES each), run by run:"
for r in $(seq "$RUNS"); do
  for k in ioctl open lookup; do
    [ "$k" != lookup ] || drop
    n=$((FILES * 10)); [ $k != lookup ] || n=$FILES
    b0=$(threads_cpu_ms "$B") sb0=$(switches "$B")
    fuse_trace_start; one_kind $k; req=$(fuse_trace_stop "$n")
    b1=$(threads_cpu_ms "$B") sb1=$(switches "$B")
    awk -v k=$k -v r="$r" -v n="$n" -v b="$b0 $b1" -v sb="$sb0 $sb1" -v req="$req" 'BEGIN {
      split(b, B, " "); split(sb, SB, " ")
      printf "  run %d %-6s B %5.1f us, %.1f switches each  (%s)\n", r, k,
        (B[2] - B[1]) * 1000 / n, (SB[2] - SB[1]) / n, req }'
  done
done
if [ "${STRACE:-1}" = 0 ]; then
  phases=
elif command -v strace > /dev/null; then
  echo "strace pass (set $RUNS): system calls per file of each daemon, calls over 0.05 per file"
  phases="fill pull hit"
else
  echo "strace not found: no system call pass"
  phases=
fi
for ph in $phases; do
  [ "$ph" != hit ] || sleep 0.5
  drop
  # One strace per daemon, so each one's calls are told apart.
  strace -q -c -f -U name,calls -S calls -p "$A" -o "$W/strace.$ph.A" &
  sta=$!
  strace -q -c -f -U name,calls -S calls -p "$B" -o "$W/strace.$ph.B" &
  stb=$!
  sleep 1   # attached to every thread
  read_set "$(phase_mnt $ph)" "$RUNS"
  [ "$ph" != pull ] || sleep 0.5
  kill -INT "$sta" "$stb"; wait "$sta" "$stb" || true
  for d in A B; do
    awk -v n="$FILES" -v ph="$ph $d" 'NF == 2 && $2 ~ /^[0-9]+$/ && $1 != "total" {
        c = $2 / n; if (c >= 0.05) s = s sprintf("%s %.2f  ", $1, c); t += c }
      END { printf "  %-6s %.1f calls per file: %s\n", ph, t, s }' "$W/strace.$ph.$d"
  done
  [ "$ph" != fill ] || restart_a
done
if [ "${PERF:-0}" != 0 ]; then
  # PERF_SAVE=DIR keeps the recordings (perf.<phase>) for `perf report -i` after the run.
  [ -z "${PERF_SAVE:-}" ] || { mkdir -p "$PERF_SAVE" && cp "$W"/perf.* "$PERF_SAVE"/; }
  # (`head` may close a report early: its SIGPIPE ends the listing, not the script.)
  for ph in ${PERF_PHASES:-pull hit}; do
    echo "perf of ${PERF_OF:-B}, $ph (run 1; self time, symbols over 1%):"
    { perf report -q -i "$W/perf.$ph" --no-children --sort sym --percent-limit 1 2>/dev/null |
      grep -E '^ +[0-9]' | head -40; } || true
    [ "$PERF" = dwarf ] || continue
    echo "perf of ${PERF_OF:-B}, $ph: the daemon's functions with their callees (over 1.5%):"
    { perf report -q -i "$W/perf.$ph" --children --sort sym --percent-limit 1.5 2>/dev/null |
      grep -E '^ +[0-9]' | grep -v '\[k\]' | head -60; } || true
  done
fi
echo "medians over $RUNS runs (both daemons' CPU per file):"
for ph in fill pull hit; do
  awk -v ph=$ph '$1 == ph {print $2}' "$W/cpu.txt" | median |
    awk -v ph=$ph '{printf "  %-4s %.0f us\n", ph, $1}'
done
