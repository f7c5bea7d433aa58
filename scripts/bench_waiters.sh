#!/usr/bin/env bash
# Many consumers waiting at once on one node for names not produced yet (the design card's
# managed directory, `dyadfs mount /dyad --ssd /nvme --wait`): 3 managed mounts (nodes 0-2, the
# name homes of 100 directories spread over all three); WAITERS consumers (threads of 5 Python
# processes) on node 0 each open a name of their own and wait. Reported per run:
#   - each daemon's CPU (utime + stime, /proc/PID/stat) over WINDOW seconds idle, before the
#     consumers start, and over WINDOW seconds with them all waiting;
#   - lookups on node 0 of names that exist (os.stat of distinct names another node produced,
#     each once): p50 and p99 before the consumers start and while they wait;
#   - then node 1 produces every name: how many consumers got their bytes, and when the last did.
# Needs root. Usage: scripts/bench_waiters.sh   (env: WAITERS (10000), WINDOW (60), RUNS (1),
# DYADFS_BIN)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
WAITERS=${WAITERS:-10000} WINDOW=${WINDOW:-60} RUNS=${RUNS:-1}
build_dyadfs
W=$(mktemp -d /var/tmp/dyadfs-waiters-bench.XXXX)
cleanup() {
  for p in "${CONSUMERS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  unmount_mounted "$W"/{0,1,2}/mnt
  rm -rf "$W"
}
CONSUMERS=()
trap cleanup EXIT
job_secret "$W/secret"
PORT=$((9000 + RANDOM % 1000))
for i in 0 1 2; do printf '%d 127.0.0.1:%d r0\n' $i $((PORT + i)); done > "$W/peers"
PY=${PYTHON:-python3}
cat > "$W/consume.py" <<'PY'
import sys, threading
d, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
threading.stack_size(256 << 10)
ok = []
def one(i):
    try:
        with open(f"{d}/w/d{i % 100}/f{i}", "rb") as f:
            if f.read() == b"%d" % i * 64:
                ok.append(i)
    except OSError:
        pass
ts = [threading.Thread(target=one, args=(i,)) for i in range(first, first + n)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(len(ok))
PY
cat > "$W/produce.py" <<'PY'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for k in range(100):
    os.makedirs(f"{d}/w/d{k}", exist_ok=True)
for i in range(n):
    with open(f"{d}/w/d{i % 100}/f{i}", "wb") as f:
        f.write(b"%d" % i * 64)
PY
cat > "$W/lookups.py" <<'PY'
import os, sys, time
d, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
took = []
for i in range(first, first + n):
    t = time.perf_counter()
    os.stat(f"{d}/present/p{i}")
    took.append(time.perf_counter() - t)
took.sort()
print(f"{1e6 * took[len(took) // 2]:.0f} {1e6 * took[min(len(took) - 1, int(0.99 * len(took)))]:.0f}")
PY
# cpu PID: the process's user + system CPU seconds so far.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
# since T: seconds from T (a `now`) to now.
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.3f", b - a}'; }
# cpu_over PIDS...: each process's CPU seconds over the next WINDOW seconds, space-separated.
cpu_over() {
  local before=() p i=0
  for p in "$@"; do before+=("$(cpu "$p")"); done
  sleep "$WINDOW"
  for p in "$@"; do awk -v a="${before[$i]}" -v b="$(cpu "$p")" 'BEGIN {printf "%.2f ", b - a}'; i=$((i + 1)); done
}
for run in $(seq "$RUNS"); do
  for i in 0 1 2; do
    rm -rf "$W/$i/ssd"; mkdir -p "$W/$i/mnt"
    "$BIN" mount "$W/$i/mnt" --ssd "$W/$i/ssd" --node-id "$i" --peers "$W/peers" --wait 600s \
      --max-waits-per-user "$WAITERS"
  done
  PIDS=()
  for i in 0 1 2; do PIDS+=("$(dyadfs_stat "$W/$i/mnt" pid)"); done
  mkdir "$W/1/mnt/present"
  for i in $(seq 0 1999); do : > "$W/1/mnt/present/p$i"; done
  until [ -e "$W/0/mnt/present/p1999" ]; do sleep 0.1; done
  idle=$(cpu_over "${PIDS[@]}")
  look_idle=$("$PY" "$W/lookups.py" "$W/0/mnt" 0 1000)
  CONSUMERS=()
  per=$((WAITERS / 5))
  for k in 0 1 2 3 4; do
    "$PY" "$W/consume.py" "$W/0/mnt" $((k * per)) "$per" > "$W/got-$k" &
    CONSUMERS+=($!)
  done
  t=$(now)
  until [ "$(dyadfs_stat "$W/0/mnt" name_waits)" -ge $((5 * per)) ]; do sleep 0.2; done
  all_waiting=$(since "$t")
  waiting=$(cpu_over "${PIDS[@]}")
  look_waiting=$("$PY" "$W/lookups.py" "$W/0/mnt" 1000 1000)
  threads=$(ls "/proc/${PIDS[0]}/task" | wc -l)
  sockets=$(ls -l "/proc/${PIDS[0]}/fd" | grep -c socket: || true)
  t=$(now)
  "$PY" "$W/produce.py" "$W/1/mnt" $((5 * per))
  produced=$(since "$t")
  wait "${CONSUMERS[@]}"
  delivered=$(since "$t")
  CONSUMERS=()
  got=$(awk '{n += $1} END {print n}' "$W"/got-*)
  printf 'run %d: %d consumers on node 0, all waiting %.1f s after they started (daemon: %d threads, %d sockets)\n' \
    "$run" $((5 * per)) "$all_waiting" "$threads" "$sockets"
  printf '  daemon CPU (s) over %d s, nodes 0 1 2: idle %s| %d waiting %s\n' "$WINDOW" "$idle" $((5 * per)) "$waiting"
  printf '  lookups of existing names on node 0, p50/p99 (us): idle %s | while waiting %s\n' \
    "${look_idle/ //}" "${look_waiting/ //}"
  printf '  produced on node 1 in %.1f s; %d of %d consumers got their bytes, the last %.1f s after the first produce\n' \
    "$produced" "$got" $((5 * per)) "$delivered"
  for i in 0 1 2; do fusermount3 -u "$W/$i/mnt"; done
  sleep 0.5
done
