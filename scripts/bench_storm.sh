#!/usr/bin/env bash
# Locator at scale: 4 daemons in 2 racks (UCX over tcp on loopback, one shared backing dir).
#   publish  every node reads its shard of FILES files (1 KiB each) at once, so the cluster
#            publishes 4 x FILES copies and every home keeps its rows
#   memory   each daemon's RSS, cached files and home rows (rack / global), and the bytes per
#            row they come to beside a single-node cache of the same files
#   storm    every node at once opens and reads STORM files of the next node's shard, which it
#            does not hold (node 0 <- 1 and 2 <- 3 in their rack, 1 <- 2 and 3 <- 0 across):
#            each open is a locator lookup and a pull. Latency of each open+read (p50, p99, max,
#            measured by the reader), the locator's own per-tier latency (the daemons'
#            histograms, bucket bounds), errors, and the shared FS bytes (must stay 0)
# Every open is timed by the reader; every byte is checked (each file starts with its number).
#
# Needs root. Usage: scripts/bench_storm.sh [WORKDIR]
# Env: FILES (250000 per node), STORM (100000 per node), PROCS (2 readers per node), DIRS (1000),
#      NOFILE (1024), KEEP (keep WORKDIR; a later run reuses its files), DYADFS_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
FILES=${FILES:-250000} STORM=${STORM:-100000} PROCS=${PROCS:-2} DIRS=${DIRS:-1000}
NOFILE=${NOFILE:-1024}
[ "$(id -u)" -eq 0 ] || { echo "bench_storm.sh needs root (drop_caches)" >&2; exit 1; }
[ "$STORM" -le "$FILES" ] || { echo "STORM ($STORM) must be at most FILES ($FILES)" >&2; exit 1; }
export UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
build_dyadfs /tmp/cargo.lock
W=${1:-$(mktemp -d /var/tmp/dyadfs-storm.XXXX)}
W=$(realpath -m "$W")
mkdir -p "$W/backing"
R=$W/results.txt
: > "$R"
cleanup() {
  set +e
  for n in 0 1 2 3; do unmount_mounted "$W/$n/mnt"; done
  if [ -z "${KEEP:-}" ]; then
    [ -s "$R" ] && cp "$R" "$W.results.txt" && echo "results kept in $W.results.txt" >&2
    rm -rf "$W"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
for n in 0 1 2 3; do unmount_mounted "$W/$n/mnt"; done
say() { printf '%s\n' "$*" | tee -a "$R"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
rss_mib() { awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }

# --- the data set: 4 x FILES files of 1 KiB, shard n = the files i with i % 4 == n ----------
echo "generating $((4 * FILES)) files under $W/backing" >&2
t0=$(now)
python3 - "$W" "$FILES" "$DIRS" <<'PY'
import os, random, sys
w, per, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
root, n = os.path.join(w, "backing"), 4 * per
name = lambda i: f"d{i % dirs:04}/f{i:08}.bin"
done = os.path.join(w, "generated")
if os.path.exists(done) and open(done).read() == str(n):
    print(f"  reusing the {n} files", file=sys.stderr)
else:
    for d in range(dirs):
        os.makedirs(os.path.join(root, f"d{d:04}"), exist_ok=True)
    pad = os.urandom(1024 - 8)
    for i in range(n):
        with open(os.path.join(root, name(i)), "wb") as f:
            f.write(i.to_bytes(8, "little") + pad)
        if (i + 1) % 200000 == 0:
            print(f"  {i + 1}/{n}", file=sys.stderr, flush=True)
    open(done, "w").write(str(n))
rng = random.Random(7)
for node in range(4):
    shard = [name(i) for i in range(node, n, 4)]
    rng.shuffle(shard)
    open(os.path.join(w, f"shard{node}"), "w").write("".join(p + "\n" for p in shard))
PY
echo "  data ready in $(since "$t0") s" >&2

# reader.py ROOT LIST COUNT PROCS LAT: opens and reads COUNT paths of LIST whole with PROCS
# processes, checking each file's number; prints "files errors wrong seconds" and writes each
# open+read's seconds to LAT.
cat > "$W/reader.py" <<'PY'
import multiprocessing as mp, os, sys, time
root, listfile, count, procs, latfile = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def work(paths):
    lat, errs, wrong = [], 0, 0
    for p in paths:
        t = time.perf_counter()
        try:
            with open(os.path.join(root, p), "rb") as f:
                b = f.read()
        except OSError:
            errs += 1
            continue
        lat.append(time.perf_counter() - t)
        wrong += len(b) != 1024 or int.from_bytes(b[:8], "little") != int(p[-12:-4])
    return lat, errs, wrong
paths = [l.rstrip("\n") for l in open(listfile)][:count]
chunks = [paths[i:i + 512] for i in range(0, len(paths), 512)]
t0 = time.monotonic()
lat, errs, wrong = [], 0, 0
with mp.get_context("fork").Pool(procs) as pool:
    for l, e, w in pool.imap_unordered(work, chunks):
        lat += l; errs += e; wrong += w
secs = time.monotonic() - t0
open(latfile, "w").write("".join(f"{x:.6f}\n" for x in lat))
print(len(paths), errs, wrong, f"{secs:.2f}")
PY
# pct FILE P: the P-th percentile of the numbers in FILE, in microseconds
pct() { sort -g "$1" | awk -v p="$2" '{a[NR]=$1} END {i=int(NR*p/100+0.5); if(i<1)i=1; if(i>NR)i=NR; printf "%.0f", a[i]*1e6}'; }
# locate_pct N TIER P: the bucket bound (us) under which P% of node N's locator lookups answered
# by TIER fell (its metrics endpoint's histogram)
locate_pct() {
  python3 -c '
import sys, urllib.request
port, tier, p = sys.argv[1], sys.argv[2], float(sys.argv[3])
b = []
for l in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode().splitlines():
    if l.startswith("dyadfs_lookup_seconds_bucket") and f"tier=\"{tier}\"" in l:
        le = l.split("le=\"")[1].split("\"")[0]
        b.append((float("inf") if le == "+Inf" else float(le), float(l.split()[-1])))
b.sort()
if not b or b[-1][1] == 0:
    print("n/a"); sys.exit()
for le, c in b:
    if c >= b[-1][1] * p / 100:
        print("inf" if le == float("inf") else f"{le * 1e6:.0f}"); break
' "$((MPORT + $1))" "$2" "$3"
}

ulimit -n "$NOFILE"
say "dyadfs locator storm, $(date -Is) on $(hostname) (Linux $(uname -r), $(nproc) CPUs)"
say "binary: $BIN$( [ -n "${DYADFS_BIN:-}" ] || echo ", tree $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock || echo ' with uncommitted changes')")"
say "config: 4 nodes in 2 racks, FILES=$FILES per node (1 KiB), STORM=$STORM per node, PROCS=$PROCS readers per node, UCX_TLS=$UCX_TLS, ulimit -n $NOFILE"

job_secret "$W/secret"
PORT=$((9000 + RANDOM % 800)) MPORT=$((PORT + 100))
printf '0 127.0.0.1:%d r0\n1 127.0.0.1:%d r0\n2 127.0.0.1:%d r1\n3 127.0.0.1:%d r1\n' \
  "$PORT" $((PORT + 1)) $((PORT + 2)) $((PORT + 3)) > "$W/peers"
declare -a PIDS
for n in 0 1 2 3; do
  rm -rf "$W/$n"; mkdir -p "$W/$n/mnt"
  MOUNT_ARGS="--metrics-listen 127.0.0.1:$((MPORT + n)) --log-file $W/$n.log" mount_node "$n" "$n"
  PIDS[n]=$(dyadfs_stat "$W/$n/mnt" pid)
done
base=(); for n in 0 1 2 3; do base[n]=$(rss_mib "${PIDS[n]}"); done
say "daemons up: RSS ${base[*]} MiB"

# --- publish ---------------------------------------------------------------------------------
drop
t0=$(now)
for n in 0 1 2 3; do
  python3 "$W/reader.py" "$W/$n/mnt" "$W/shard$n" "$FILES" "$PROCS" "$W/lat-pub$n" > "$W/pub$n" &
done
wait
say "publish: 4 x $FILES files read (each node its shard) in $(since "$t0") s"
for n in 0 1 2 3; do
  read -r f e x s < "$W/pub$n"
  say "  node $n: $f files in $s s, $e errors, $x wrong"
done
# Publishes are batched: wait until every file has its rows (a rack home's and a global home's).
want=$((4 * FILES))
for _ in $(seq 120); do
  rows=0; grows=0
  for n in 0 1 2 3; do
    rows=$((rows + $(dyadfs_stat "$W/$n/mnt" home_rack_files)))
    grows=$((grows + $(dyadfs_stat "$W/$n/mnt" home_global_files)))
  done
  [ "$rows" -lt "$want" ] || [ "$grows" -lt "$want" ] || break
  sleep 1
done
say "home rows: rack $rows, global $grows (want $want each)"
say "memory after publishing (RSS, cached files, rack rows, global rows, inodes):"
for n in 0 1 2 3; do
  p=${PIDS[n]}
  say "  node $n: $(rss_mib "$p") MiB (at start ${base[n]}), $(dyadfs_stat "$W/$n/mnt" cached_files) cached, $(dyadfs_stat "$W/$n/mnt" home_rack_files) rack rows, $(dyadfs_stat "$W/$n/mnt" home_global_files) global rows, $(dyadfs_stat "$W/$n/mnt" inodes) inodes"
done

# --- storm -----------------------------------------------------------------------------------
before=(); for n in 0 1 2 3; do before[n]=$(dyadfs_stat "$W/$n/mnt" bytes_from_backing); done
t0=$(now)
for n in 0 1 2 3; do
  python3 "$W/reader.py" "$W/$n/mnt" "$W/shard$(((n + 1) % 4))" "$STORM" "$PROCS" "$W/lat$n" > "$W/storm$n" &
done
wait
say "storm: every node opened $STORM files it did not hold, all at once, in $(since "$t0") s"
say "  node  files  errors  wrong  seconds  files/s  open+read p50/p99/max us   locate rack p50/p99 us  global p50/p99 us  shared FS bytes"
for n in 0 1 2 3; do
  read -r f e x s < "$W/storm$n"
  back=$(( $(dyadfs_stat "$W/$n/mnt" bytes_from_backing) - before[n] ))
  say "$(printf '  %4d %6d %7d %6d %8s %8.0f  %8s %8s %8s   %10s %10s   %8s %8s  %15d' \
    "$n" "$f" "$e" "$x" "$s" "$(echo "$f / $s" | bc -l)" \
    "$(pct "$W/lat$n" 50)" "$(pct "$W/lat$n" 99)" "$(pct "$W/lat$n" 100)" \
    "$(locate_pct "$n" rack 50)" "$(locate_pct "$n" rack 99)" \
    "$(locate_pct "$n" global 50)" "$(locate_pct "$n" global 99)" "$back")"
done
cat "$W"/lat[0-3] > "$W/lat-all"
say "  all nodes: open+read p50 $(pct "$W/lat-all" 50) us, p99 $(pct "$W/lat-all" 99) us, p99.9 $(pct "$W/lat-all" 99.9) us, max $(pct "$W/lat-all" 100) us"
say "memory after the storm:"
for n in 0 1 2 3; do
  say "  node $n: $(rss_mib "${PIDS[n]}") MiB, $(dyadfs_stat "$W/$n/mnt" cached_files) cached, $(dyadfs_stat "$W/$n/mnt" home_rack_files) rack rows, $(dyadfs_stat "$W/$n/mnt" home_global_files) global rows"
done
say "(locate percentiles are the upper bounds of the histogram buckets they fall in: 50 us doublings)"
