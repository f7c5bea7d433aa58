#!/usr/bin/env bash
# Scale benchmark: N small files (1-16 KiB, random sizes) spread over DIRS directories, read
# whole in shuffled order by 4 processes, side by side:
#   direct    the backing directory itself (page cache dropped first)
#   pass 1    through a fresh dyadfs mount, cold cache (every file comes from the backing dir)
#   pass 2    through the same mount again (every file cached, unless CAPACITY forces eviction)
#   pass 3    after an unmount and a remount (restart timed), a random sample of SAMPLE files,
#             which must all be local hits
# Every pass counts the files it failed to read (EMFILE inside the daemon shows up as EIO here)
# instead of stopping. After pass 2 it reports the daemon's RSS, open descriptors, the cache
# index size and RSS per cached file; then `find` over the tree and a scandir+stat of one wide
# directory of SCANDIR files, each on the backing dir vs the mount (page cache dropped before
# each). Everything runs under `ulimit -n NOFILE` (soft and hard), which the daemon inherits.
# Prints each figure as it is measured and a summary at the end; all of it also goes to
# WORKDIR/results.txt (copied next to WORKDIR when WORKDIR is removed).
#
# Needs root. Usage: scripts/bench_scale.sh [WORKDIR]
# Env: N (1000000), DIRS (1000), NOFILE (1024), SCANDIR (100000), SAMPLE (10000), PROCS (4),
#      CAPACITY (e.g. 2G: a cache capacity smaller than the data, to force eviction churn),
#      KEEP (keep WORKDIR; a later run with the same WORKDIR reuses the generated files),
#      MALLOC_STATS (print glibc's per-arena heap totals of the daemon, through gdb),
#      DYADFS_BIN (a dyadfs binary to measure instead of this tree's release build),
#      MOUNT_ARGS (more options for the mount, e.g. "--pack-max 1M")
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
N=${N:-1000000} DIRS=${DIRS:-1000} NOFILE=${NOFILE:-1024} SCANDIR=${SCANDIR:-100000}
SAMPLE=${SAMPLE:-10000} PROCS=${PROCS:-4} CAPACITY=${CAPACITY:-}
[ "$(id -u)" -eq 0 ] || { echo "bench_scale.sh needs root (drop_caches, FUSE passthrough)" >&2; exit 1; }
build_dyadfs /tmp/cargo.lock
W=${1:-$(mktemp -d /var/tmp/dyadfs-scale.XXXX)}
W=$(realpath -m "$W")
mkdir -p "$W"/{backing,mnt}
R=$W/results.txt
: > "$R"

cleanup() {
  set +e
  if mountpoint -q "$W/mnt"; then
    fusermount3 -u "$W/mnt" || { sleep 1; fusermount3 -u "$W/mnt"; } || fusermount3 -uz "$W/mnt"
  fi
  if [ -z "${KEEP:-}" ]; then
    [ -s "$R" ] && cp "$R" "$W.results.txt" && echo "results kept in $W.results.txt" >&2
    rm -rf "$W"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
# A mount left over by an interrupted KEEP run of the same WORKDIR.
unmount_mounted "$W/mnt"

say() { printf '%s\n' "$*" | tee -a "$R"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
calc() { awk "BEGIN { printf \"$1\", $2 }"; } # calc FORMAT EXPR
# jget FILE KEY: a top-level value of a JSON object ("n/a" when missing or unreadable)
jget() {
  python3 - "$1" "$2" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1])).get(sys.argv[2])
except Exception:
    v = None
print("n/a" if v is None else str(v).lower() if isinstance(v, bool) else v)
PY
}
stats() { "$BIN" stats "$W/mnt" --json > "$1" 2>/dev/null || echo '{}' > "$1"; }
mount_fs() {
  local args=()
  [ -z "$CAPACITY" ] || args=(--capacity "$CAPACITY")
  # shellcheck disable=SC2086 # MOUNT_ARGS is a list of options
  "$BIN" mount "$W/mnt" --ssd "$W/ssd" --backing "$W/backing" --log-file "$W/dyadfs.log" "${args[@]}" ${MOUNT_ARGS:-}
}
# The daemon of the mount: its pid from `stats --json`, else the newest process started with
# `mount $W/mnt`; checked against /proc/PID/cmdline.
daemon_pid() {
  local p
  stats "$W/pid.json"
  for p in "$(jget "$W/pid.json" pid)" "$(pgrep -n -f -- "mount $W/mnt( |\$)" || true)"; do
    if [[ $p =~ ^[0-9]+$ ]] && tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q -- "mount $W/mnt"; then
      echo "$p"
      return
    fi
  done
}
# daemon_figures LABEL PID: memory and descriptors of the daemon, as it is now
daemon_figures() {
  local pid=$2
  if [ -z "$pid" ] || [ ! -d "/proc/$pid" ]; then
    say "daemon ($1): not running"
    return
  fi
  local rss hwm fds thr lim
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status")
  hwm=$(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status")
  thr=$(awk '/^Threads:/ { print $2 }' "/proc/$pid/status")
  fds=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
  lim=$(awk '/^Max open files/ { print $4 "/" $5 }' "/proc/$pid/limits")
  say "daemon ($1): pid $pid, RSS $(calc %.1f "$rss / 1024") MiB (peak $(calc %.1f "$hwm / 1024") MiB), $fds open descriptors (limit soft/hard $lim), $thr threads"
  if [ -n "${MALLOC_STATS:-}" ] && command -v gdb > /dev/null; then
    # glibc's per-arena totals (system bytes vs in use: what the heap holds free), which the
    # daemon prints on its stderr, the log file.
    local at; at=$(wc -l < "$W/dyadfs.log")
    gdb -p "$pid" -batch -ex 'call (void)malloc_stats()' > /dev/null 2>&1 || true
    tail -n +"$((at + 1))" "$W/dyadfs.log" | grep -E '^(Arena|system|in use|Total|max mmap)' \
      | paste -sd' ' | sed 's/Arena/\nArena/g; s/Total/\nTotal/' | sed '/^$/d' | tee -a "$R"
  fi
  DAEMON_RSS_KB=$rss
}

# reader.py ROOT LIST PROCS: opens and reads whole every path of LIST (relative to ROOT) with
# PROCS processes; prints "files errors seconds bytes", and the kinds of errors to stderr.
cat > "$W/read.py" <<'PY'
import errno, multiprocessing as mp, os, sys, time
from collections import Counter

root, listfile, procs = sys.argv[1], sys.argv[2], int(sys.argv[3])

def work(paths):
    nbytes = errs = 0
    kinds, example = Counter(), {}
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
            try:
                while True:
                    b = os.read(fd, 1 << 20)
                    if not b:
                        break
                    nbytes += len(b)
            finally:
                os.close(fd)
        except OSError as e:
            errs += 1
            k = f"{errno.errorcode.get(e.errno, e.errno)} ({e.strerror})"
            kinds[k] += 1
            example.setdefault(k, p)
    return len(paths), errs, nbytes, kinds, example

paths = [l.rstrip("\n") for l in open(listfile) if l.strip()]
chunks = [paths[i:i + 256] for i in range(0, len(paths), 256)]
os.chdir(root)
files = errs = nbytes = 0
kinds, example = Counter(), {}
step = max(100000, len(paths) // 10)
t0 = time.monotonic()
with mp.get_context("fork").Pool(procs) as pool:
    for n, e, b, k, ex in pool.imap_unordered(work, chunks):
        if files // step != (files + n) // step:
            print(f"  ... {files + n}/{len(paths)} files, {errs + e} errors, "
                  f"{time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        files, errs, nbytes = files + n, errs + e, nbytes + b
        kinds.update(k)
        for key, p in ex.items():
            example.setdefault(key, p)
print(files, errs, f"{time.monotonic() - t0:.3f}", nbytes)
for k, c in kinds.most_common():
    print(f"  {c} x {k}, e.g. {example[k]}", file=sys.stderr)
PY

# scan.py DIR: lists DIR with os.scandir, then stats every entry; prints
# "entries list_seconds stat_seconds errors".
cat > "$W/scan.py" <<'PY'
import os, sys, time
t0 = time.monotonic()
try:
    entries = list(os.scandir(sys.argv[1]))
except OSError as e:
    print(f"  scandir {sys.argv[1]}: {e}", file=sys.stderr)
    print(0, "nan", "nan", 1)
    sys.exit()
t1 = time.monotonic()
errs = 0
for e in entries:
    try:
        e.stat()
    except OSError as x:
        if not errs:
            print(f"  stat {e.path}: {x}", file=sys.stderr)
        errs += 1
print(len(entries), f"{t1 - t0:.3f}", f"{time.monotonic() - t1:.3f}", errs)
PY

# --- 1. the data set -------------------------------------------------------------------------
echo "generating $N files in $DIRS directories and $SCANDIR files in wide/ under $W/backing" >&2
t0=$(now)
python3 - "$W/backing" "$W/list" "$N" "$DIRS" "$SCANDIR" <<'PY'
import os, random, sys
root, listfile, n, dirs, nwide = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
buf = os.urandom(16 << 10)  # one random buffer; an 8-byte prefix makes each file distinct
def write(path, i, size):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, i.to_bytes(8, "little") + buf[8:size])
    finally:
        os.close(fd)
w, dw = len(str(max(n - 1, 0))), len(str(max(dirs - 1, 0)))
name = lambda i: f"d{i % dirs:0{dw}}/f{i:0{w}}.bin"
def complete():
    try:
        with open(listfile) as f:
            return sum(1 for _ in f) == n and os.path.exists(os.path.join(root, name(n - 1)))
    except OSError:
        return False
if complete():
    print(f"  reusing the {n} files of {root}", file=sys.stderr)
else:
    for d in range(dirs):
        os.makedirs(os.path.join(root, f"d{d:0{dw}}"), exist_ok=True)
    rng = random.Random(1)
    paths = []
    for i in range(n):
        p = name(i)
        write(os.path.join(root, p), i, rng.randint(1 << 10, 16 << 10))
        paths.append(p)
        if (i + 1) % 100000 == 0:
            print(f"  {i + 1}/{n} files", file=sys.stderr, flush=True)
    rng.shuffle(paths)  # the order every pass reads in
    with open(listfile + ".tmp", "w") as f:
        f.write("".join(p + "\n" for p in paths))
    os.rename(listfile + ".tmp", listfile)
wide = os.path.join(root, "wide")
last = os.path.join(wide, f"w{max(nwide - 1, 0):08}")
if nwide and not os.path.exists(last):
    os.makedirs(wide, exist_ok=True)
    for i in range(nwide):
        write(os.path.join(wide, f"w{i:08}"), i, 1 << 10)
        if (i + 1) % 100000 == 0:
            print(f"  {i + 1}/{nwide} files in wide/", file=sys.stderr, flush=True)
PY
echo "  data ready in $(since "$t0") s" >&2
shuf -n "$SAMPLE" --random-source=<(yes) "$W/list" > "$W/sample"

# --- 2. the descriptor limit -----------------------------------------------------------------
ulimit -n "$NOFILE"   # soft and hard; the readers, find and the daemon inherit it

say "dyadfs scale benchmark, $(date -Is) on $(hostname) (Linux $(uname -r), $(nproc) CPUs)"
say "binary: $BIN ($("$BIN" --version 2>/dev/null || echo '?'))$( [ -n "${DYADFS_BIN:-}" ] || echo ", tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null || echo ' with uncommitted changes')")"
say "config: N=$N files in DIRS=$DIRS directories, PROCS=$PROCS readers, mount options '${MOUNT_ARGS:-}', ulimit -n $(ulimit -Sn)/$(ulimit -Hn) (soft/hard), CAPACITY=${CAPACITY:-default}, SCANDIR=$SCANDIR, SAMPLE=$(wc -l < "$W/sample"), workdir $W"

# --- 3. direct, pass 1, pass 2 ---------------------------------------------------------------
declare -A F E T B H M
# read_pass KEY LABEL DIR LIST: one timed read of every path of LIST under DIR
read_pass() {
  local key=$1 label=$2 out
  echo "$label ..." >&2
  out=$(python3 "$W/read.py" "$3" "$4" "$PROCS" 2> "$W/errors-$key.txt") \
    || { cat "$W/errors-$key.txt" >&2; echo "the reader failed" >&2; exit 1; }
  read -r "F[$key]" "E[$key]" "T[$key]" "B[$key]" <<< "$out"
  say "$label: ${F[$key]} files in ${T[$key]} s = $(calc %.0f "${F[$key]} / ${T[$key]}") files/s ($(calc %.1f "${B[$key]} / 1048576 / ${T[$key]}") MiB/s), ${E[$key]} errors"
  if [ -s "$W/errors-$key.txt" ]; then
    grep -v '^  \.\.\. ' "$W/errors-$key.txt" | head -5 | tee -a "$R" || true
  fi
}
# hits KEY BEFORE AFTER: the local hits and backing fetches between two stats snapshots
hits() {
  H[$1]=$(calc %d "$(jget "$3" local_hits) - $(jget "$2" local_hits)" 2>/dev/null || echo n/a)
  M[$1]=$(calc %d "$(jget "$3" backing_fetches) - $(jget "$2" backing_fetches)" 2>/dev/null || echo n/a)
  say "  $1: local_hits +${H[$1]}, backing_fetches +${M[$1]} (evictions so far: $(jget "$3" evictions))"
}

drop
read_pass direct "direct (backing dir, page cache dropped)" "$W/backing" "$W/list"

rm -rf "$W/ssd"
t0=$(now)
mount_fs
say "mount (empty cache): $(since "$t0") s"
PID=$(daemon_pid)
say "daemon pid: ${PID:-not found}"
stats "$W/stats0.json"
drop
read_pass pass1 "dyadfs pass 1 (cold cache, page cache dropped)" "$W/mnt" "$W/list"
stats "$W/stats1.json"
hits pass1 "$W/stats0.json" "$W/stats1.json"
read_pass pass2 "dyadfs pass 2 (cached)" "$W/mnt" "$W/list"
stats "$W/stats.json"
hits pass2 "$W/stats1.json" "$W/stats.json"

# --- 4. the daemon after pass 2 --------------------------------------------------------------
DAEMON_RSS_KB=
daemon_figures "after pass 2" "$PID"
say "stats --json after pass 2 (saved to $W/stats.json):"
tee -a "$R" < "$W/stats.json"; echo | tee -a "$R"
CACHED=$(jget "$W/stats.json" cached_files)
if [ -n "$DAEMON_RSS_KB" ] && [[ $CACHED =~ ^[0-9]+$ ]] && [ "$CACHED" -gt 0 ]; then
  say "RSS per cached file: $(calc %.0f "$DAEMON_RSS_KB * 1024 / $CACHED") bytes ($CACHED cached files, $(jget "$W/stats.json" cached_bytes) bytes cached)"
else
  say "RSS per cached file: n/a (cached_files $CACHED)"
fi
if [ -e "$W/ssd/index.log" ]; then
  say "cache index $W/ssd/index.log: $(du -sh "$W/ssd/index.log" | cut -f1) on disk ($(stat -c %s "$W/ssd/index.log") bytes)"
else
  say "cache index: no $W/ssd/index.log"
fi
say "cache dir $W/ssd: $(du -sh "$W/ssd" | cut -f1), $(find "$W/ssd/data" -type f 2>/dev/null | wc -l) data files, $(find "$W/ssd/segments" -type f 2>/dev/null | wc -l) segment files"

# --- 5. metadata: find, scandir --------------------------------------------------------------
# find_count LABEL DIR: prints the count; records the seconds in FT and errors in FE
find_count() {
  local t0 c
  drop
  t0=$(now)
  c=$(find "$2" -type f 2> "$W/find.err" | wc -l) || true
  FT=$(since "$t0") FE=$(wc -l < "$W/find.err")
  say "find $1 -type f | wc -l (page cache dropped): $c files in $FT s, $FE errors"
  [ "$FE" -eq 0 ] || head -3 "$W/find.err" | tee -a "$R"
}
find_count "backing" "$W/backing"; FIND_B=$FT
find_count "mount" "$W/mnt"; FIND_M=$FT
say "find mount/backing time ratio: $(calc %.2f "$FIND_M / ($FIND_B > 0 ? $FIND_B : 0.001)")"
if [ "$SCANDIR" -gt 0 ]; then
  for where in backing mnt; do
    drop
    read -r n tl ts se < <(python3 "$W/scan.py" "$W/$where/wide" 2> >(tee -a "$R" >&2))
    say "scandir+stat of wide/ ($where): $n entries, scandir $tl s, stat of every entry $ts s, $se errors"
  done
fi

# --- 6. restart ------------------------------------------------------------------------------
t0=$(now)
fusermount3 -u "$W/mnt"
say "unmount: $(since "$t0") s"
if [ -n "$PID" ]; then
  waited=0
  while kill -0 "$PID" 2>/dev/null && [ $waited -lt 3000 ]; do sleep 0.1; waited=$((waited + 1)); done
  if kill -0 "$PID" 2>/dev/null; then say "daemon $PID still running 300 s after the unmount"; else say "daemon exited $(since "$t0") s after the unmount began"; fi
fi
drop
t0=$(now)
mount_fs
RESTART=$(since "$t0")
say "restart: mount over the full cache returned in $RESTART s (page cache dropped before)"
PID=$(daemon_pid)
stats "$W/stats2.json"
say "  after restart: cached_files $(jget "$W/stats2.json" cached_files), cached_bytes $(jget "$W/stats2.json" cached_bytes)"
read_pass pass3 "dyadfs pass 3 (after restart, random sample)" "$W/mnt" "$W/sample"
stats "$W/stats3.json"
hits pass3 "$W/stats2.json" "$W/stats3.json"
[ "${H[pass3]}" = "${F[pass3]}" ] || say "  WARNING: pass 3 read ${F[pass3]} files but had ${H[pass3]} local hits (evicted, or lost in the restart)"
daemon_figures "after restart and pass 3" "$PID"

# --- 7. summary ------------------------------------------------------------------------------
say ""
say "summary (N=$N, DIRS=$DIRS, NOFILE=$NOFILE, CAPACITY=${CAPACITY:-default}, $PROCS readers)"
say "$(printf '%-34s %9s %8s %9s %10s %8s %11s %11s' config files errors seconds files/s MiB/s local_hits backing_f.)"
for key in direct pass1 pass2 pass3; do
  case $key in
    direct) label="direct (backing dir, cold)" ;;
    pass1) label="dyadfs pass 1 (cold cache)" ;;
    pass2) label="dyadfs pass 2 (cached)" ;;
    pass3) label="dyadfs pass 3 (restart, sample)" ;;
  esac
  say "$(printf '%-34s %9s %8s %9s %10s %8s %11s %11s' "$label" "${F[$key]}" "${E[$key]}" "${T[$key]}" \
    "$(calc %.0f "${F[$key]} / ${T[$key]}")" "$(calc %.1f "${B[$key]} / 1048576 / ${T[$key]}")" \
    "${H[$key]:--}" "${M[$key]:--}")"
done
say "dyadfs / direct rate: pass 1 $(calc %.2f "${T[direct]} / ${T[pass1]}")x, pass 2 $(calc %.2f "${T[direct]} / ${T[pass2]}")x"
say "find: backing $FIND_B s, mount $FIND_M s; restart $RESTART s"
ERRS=$((E[pass1] + E[pass2] + E[pass3]))
[ "$ERRS" -eq 0 ] || say "ERRORS through the mount: $ERRS (their kinds are listed under each pass above)"
if [ -f "$W/dyadfs.log" ]; then
  nw=$(grep -c ' WARN ' "$W/dyadfs.log" || true) ne=$(grep -c ' ERROR ' "$W/dyadfs.log" || true)
  say "daemon log $W/dyadfs.log: $nw WARN, $ne ERROR lines$( [ $((nw + ne)) -eq 0 ] || echo '; the last of them:')"
  { grep ' ERROR ' "$W/dyadfs.log" | tail -3; grep ' WARN ' "$W/dyadfs.log" | tail -3; } | tee -a "$R" || true
fi
say "results in $R"
