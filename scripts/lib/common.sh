# shellcheck shell=bash
# Helpers shared by the scripts under scripts/ (sourced, not run): `. scripts/lib/common.sh`
# after the script's `cd` to the repository root, which the relative paths below assume.
# Defines functions only: sets no shell option and runs nothing when sourced.
#   median           the median of numbers read one a line
#   now              the time in seconds, with nanoseconds
#   drop             drops the page cache
#   job_secret       makes the job secret and exports DYADFS_SECRET_FILE
#   build_dyadfs     the binary under test (DYADFS_BIN, else this tree's release build): BIN
#   build_examples   this tree's release builds of the examples named
#   unmount_mounted  unmounts those of the mount points given that are mounted
#   mount_node       mounts a node of a benchmark's test cluster under $W
#   dyadfs_stat      one value of a mount's `dyadfs stats --json`
#   ucx_home         the UCX dyadfs links
#   ucx_perftest_run ucx_perftest of that UCX
#   perftest_get     one ucx_perftest -t ucp_get run, in MB/s
#   threads_cpu_ms   a process's CPU so far, its threads' schedstat summed
#   switches         a process's context switches so far, its threads' summed
#   wait_daemons_gone  waits for the daemons mounted under a directory to exit
#   fuse_trace_*     the FUSE requests the kernel sends, counted by opcode (tracefs)
#   bench_users      makes the system users a benchmark reads as
#   random_files     a dataset of random samples
#   unmount_users    unmounts those of users' mount points given that are mounted
#   small_files      many small files (1-4 KiB) in many directories
#   site_peers       a site's peers file on free loopback ports
#   node_serve, node_stop, node_stat, node_mount, node_cleanup
#                    one node service of a benchmark under $W, its dataset and mount

# Benchmarks report medians of RUNS runs: the middle value (the lower middle one of an even count).
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# Wall-clock seconds with nanoseconds, for timings computed with bc or awk.
now() { date +%s.%N; }

# Cold runs: writes back and drops the page cache (needs root), so reads reach the disk again.
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# job_secret FILE: the job secret every node proves on every connection (as `dyadfs keygen`
# writes it; made here so that an older DYADFS_BIN, which ignores it, can be measured too),
# private to the user; exports DYADFS_SECRET_FILE=FILE for the daemons started after.
job_secret() {
  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$1")
  export DYADFS_SECRET_FILE=$1
}

# build_dyadfs [LOCK]: sets BIN to DYADFS_BIN (a dyadfs binary to measure instead of this tree's
# build) or, without it, installs the packages and builds this tree's release binary (under
# `flock LOCK` when given, so that two builds sharing the lock never run at once).
# shellcheck disable=SC2120 # LOCK is optional
build_dyadfs() {
  if [ -z "${DYADFS_BIN:-}" ]; then
    scripts/install-deps.sh
    if [ -n "${1:-}" ]; then
      flock "$1" cargo build --release --quiet
    else
      cargo build --release --quiet
    fi
  fi
  BIN=${DYADFS_BIN:-$PWD/target/release/dyadfs}
}

# build_examples NAME...: builds the release examples named; on a machine without cargo (a lent
# machine the builds were carried to) checks that they are built instead.
build_examples() {
  local n args=()
  if command -v cargo > /dev/null; then
    for n in "$@"; do args+=(--example "$n"); done
    cargo build --release --quiet "${args[@]}"
    return
  fi
  for n in "$@"; do
    [ -x "target/release/examples/$n" ] ||
      { echo "no cargo here and target/release/examples/$n is not built" >&2; return 1; }
  done
}

# unmount_mounted MNT...: for cleanup traps, unmounts each FUSE mount point given that is still
# mounted; one not mounted is no failure (a failing fusermount3 is, as under set -e).
unmount_mounted() {
  local m
  for m in "$@"; do
    if mountpoint -q "$m"; then fusermount3 -u "$m"; fi
  done
}

# mount_node NODE ID: mounts node NODE of a test cluster at $W/NODE/mnt (cache $W/NODE/ssd) as
# node ID of $W/peers over $W/backing, with $BIN and the extra mount options in MOUNT_ARGS.
mount_node() {
  # shellcheck disable=SC2086 # MOUNT_ARGS and BIN_ARGS are lists of options, split into words
  "$BIN" mount "$W/$1/mnt" --ssd "$W/$1/ssd" --backing "$W/backing" --node-id "$2" \
    --peers "$W/peers" ${MOUNT_ARGS:-} ${BIN_ARGS:-}
  # A cache file system over 90% full at the mount gives the default capacity nothing: the run
  # would measure a node that caches nothing (and serves its peers nothing).
  if [ "$(dyadfs_stat "$W/$1/mnt" capacity_bytes 2>/dev/null)" = 0 ]; then
    local avail used
    read -r avail used < <(df -h --output=avail,pcent "$W/$1/ssd" | tail -1)
    echo "node $1's cache has no capacity (its file system: $avail available, $used used);" \
      "free space or give --capacity in MOUNT_ARGS" >&2
    exit 1
  fi
}

# A BINS entry is a binary, optionally with mount options after a colon
# ("target/release/dyadfs:--data-plane=ucx,--ucx-over-tcp"): bin_of and args_of split it.
bin_of() { echo "${1%%:*}"; }
args_of() { case "$1" in *:*) echo "${1#*:}" | tr ',' ' ' ;; *) echo "" ;; esac; }

# remount_holder ENTRY: (re)mounts node A ("a", id 0) with the BINS entry ENTRY unless it runs it
# already (A and B must run the same build: builds of other protocol versions cannot talk).
remount_holder() {
  [ "${HOLDER:-}" = "$1" ] && return 0
  if mountpoint -q "$W/a/mnt"; then fusermount3 -u "$W/a/mnt"; sleep 0.3; fi
  BIN=$(bin_of "$1") BIN_ARGS=$(args_of "$1") mount_node a 0
  HOLDER=$1
}

# dyadfs_stat MNT KEY: a top-level value of `$BIN stats MNT --json` (a benchmark's checks that the
# bytes came from where it says).
dyadfs_stat() {
  "$BIN" stats "$1" --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}

# The UCX dyadfs links (UCX_DIR, else the .tools/ucx/libucx scripts/install-deps.sh fills),
# where ucx-sys/build.rs looks for it too.
ucx_home() { echo "${UCX_DIR:-${DYADFS_TOOLS:-$PWD/.tools}/ucx/libucx}"; }

# ucx_perftest_run ARGS...: that UCX's ucx_perftest.
ucx_perftest_run() {
  local home
  home=$(ucx_home)
  # With UCX's default memory hooks, as it is measured elsewhere (install-deps.sh turns them off
  # for dyadfs in UCX's configuration file; the environment wins over that file).
  UCX_MEM_MMAP_HOOK_MODE=${UCX_MEM_MMAP_HOOK_MODE:-bistro} \
    LD_LIBRARY_PATH="$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$home/bin/ucx_perftest" "$@"
}

# perftest_get SIZE ITERS PORT SERVER_LOG: the UCX baseline the dyadfs figures are compared with,
# ucx_perftest -t ucp_get of ITERS messages of SIZE bytes (server in the background, its output
# to SERVER_LOG; client on 127.0.0.1:PORT); prints the final bandwidth in MB/s of 1e6 bytes like
# dyadfs's figures (ucx_perftest's "MB/s" are MiB/s).
# It is the ucx_perftest of the UCX dyadfs links (scripts/install-deps.sh puts both in .tools/ucx).
perftest_get() {
  local srv
  ucx_perftest_run -t ucp_get -s "$1" -n "$2" -p "$3" > "$4" 2>&1 &
  srv=$!
  sleep 0.5
  ucx_perftest_run 127.0.0.1 -t ucp_get -s "$1" -n "$2" -p "$3" 2>/dev/null |
    awk '/^Final:/ {printf "%.1f\n", $7 * 1.048576}'
  wait "$srv" || true
}

# threads_cpu_ms PID: the CPU all of process PID's threads have used, in ms, from their schedstat
# (nanoseconds on a CPU): /proc/PID/stat counts 10 ms ticks, too coarse for a few microseconds a
# request.
threads_cpu_ms() { cat /proc/"$1"/task/*/schedstat | awk '{s += $1} END {printf "%.3f", s / 1e6}'; }

# switches PID: the context switches of all of process PID's threads (each costs CPU: on a VM,
# a lot).
switches() { cat /proc/"$1"/task/*/status | awk '/ctxt_switches/ {s += $2} END {print s}'; }

# wait_daemons_gone DIR: waits (5 s at most) until no dyadfs mounted under DIR runs: a daemon
# lets go of its cache directory as it exits, after its unmount returned.
wait_daemons_gone() {
  local _
  for _ in $(seq 50); do
    pgrep -f -- " mount $1/" > /dev/null || return 0
    sleep 0.1
  done
}

# fuse_trace_ready: mounts tracefs at /sys/kernel/tracing unless the fuse events are there
# already; sets FUSE_TRACEFS_MOUNTED=1 when it mounted it (the caller's cleanup unmounts it).
FUSE_TRACE=/sys/kernel/tracing
fuse_trace_ready() {
  [ ! -d "$FUSE_TRACE/events/fuse" ] || return 0
  mountpoint -q "$FUSE_TRACE" || { mount -t tracefs nodev "$FUSE_TRACE"; FUSE_TRACEFS_MOUNTED=1; }
}

# fuse_trace_start: clears the trace buffer and starts recording fuse:fuse_request_send.
fuse_trace_start() {
  echo 0 > "$FUSE_TRACE/tracing_on"; echo > "$FUSE_TRACE/trace"
  echo 16384 > "$FUSE_TRACE/buffer_size_kb"
  echo 1 > "$FUSE_TRACE/events/fuse/fuse_request_send/enable"; echo 1 > "$FUSE_TRACE/tracing_on"
}

# fuse_trace_stop N: stops recording; prints the requests sent per N (a sample) by opcode, as
# "LOOKUP 1.00  OPEN 1.00  ... = 4.00", those of at least 0.01 per sample.
fuse_trace_stop() {
  echo 0 > "$FUSE_TRACE/tracing_on"; echo 0 > "$FUSE_TRACE/events/fuse/fuse_request_send/enable"
  grep -o '(FUSE_[A-Z_]*)' "$FUSE_TRACE/trace" | tr -d '()' | sed 's/^FUSE_//' | sort | uniq -c |
    awk -v n="$1" '{t += $1; if ($1 / n >= 0.01) printf "%s %.2f  ", $2, $1 / n} END {printf "= %.2f", t / n}'
}

# bench_users USER...: the system users a benchmark reads as, made if missing (kept after it:
# the next run uses them again).
bench_users() {
  local u
  for u in "$@"; do
    id "$u" > /dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$u"
  done
}

# random_files DIR N SIZE: DIR/0.npy .. DIR/(N-1).npy, each SIZE random bytes (a dataset's
# samples).
random_files() {
  echo "generating $2 files of $3 bytes" >&2
  python3 - "$1" "$2" "$3" <<'PY'
import os, sys
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    open(os.path.join(d, f"{i}.npy"), "wb").write(os.urandom(size))
PY
}

# unmount_users MNT...: for cleanup traps, lazily unmounts each users' mount point given that
# is mounted (root may not even stat a user's mount without allow_other: the mount table says).
unmount_users() {
  local m
  for m in "$@"; do
    if grep -q " $m " /proc/mounts; then fusermount3 -uz "$m"; fi
  done
}

# small_files DIR N DIRS: DIR/d<i % DIRS>/<i>.bin for i in 0..N, 1-4 KiB each (the same bytes
# for the same arguments).
small_files() {
  python3 - "$1" "$2" "$3" <<'PY'
import os, random, sys
root, n, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(1)
blob = os.urandom(4096)
for d in range(min(n, dirs)):
    os.makedirs(os.path.join(root, f"d{d}"), exist_ok=True)
for i in range(n):
    with open(os.path.join(root, f"d{i % dirs}", f"{i}.bin"), "wb") as f:
        f.write(blob[: rnd.randint(1024, 4096)])
PY
}

# site_peers N PER_RACK: a site's peers file on stdout, N services on free 127.0.0.1 ports below
# the ephemeral range, PER_RACK to a rack (r0, r1, ...).
site_peers() {
  python3 - "$1" "$2" <<'PY'
import socket, sys
n, per_rack = int(sys.argv[1]), int(sys.argv[2])
ports = []
for p in range(21000, 22000):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    ports.append(p)
    if len(ports) == n:
        break
for i, p in enumerate(ports):
    print(f"{i} 127.0.0.1:{p} r{i // per_rack}")
PY
}

# node_serve [ARGS...]: starts `$BIN node serve` on $W/node (socket $W/node.sock, log
# $W/node.log) with ARGS and waits until it answers (every dataset loaded); its PID in
# `service`, the seconds that took in $W/start.t. Call it in the script's shell, never in
# $(...): the service would hold the substitution's pipe.
node_serve() {
  "$BIN" node serve --ssd "$W/node" --socket "$W/node.sock" "$@" > /dev/null 2>> "$W/node.log" &
  service=$!
  local t0
  t0=$(now)
  until "$BIN" node status --socket "$W/node.sock" > /dev/null 2>&1; do sleep 0.02; done
  printf '%.3f\n' "$(echo "$(now) - $t0" | bc -l)" > "$W/start.t"
}

# node_stop: stops the service node_serve started.
node_stop() { kill "$service"; wait "$service" || true; service=; }

# node_stat KEY: one value of the service's first dataset in `node status --json`.
node_stat() {
  "$BIN" node status --socket "$W/node.sock" --json |
    python3 -c "import json,sys; print(json.load(sys.stdin)['datasets'][0]['$1'])"
}

# node_mount: mounts $W/shared on $W/mnt through the service (the user's mount, attached).
node_mount() {
  "$BIN" mount "$W/mnt" --ssd "$W/unused" --backing "$W/shared" --node-socket "$W/node.sock" \
    2> /dev/null
}

# node_cleanup: for an EXIT trap: unmounts $W/mnt, stops the service, removes $W unless KEEP.
node_cleanup() {
  set +e
  unmount_mounted "$W/mnt"
  [ -z "${service:-}" ] || { kill "$service"; wait "$service"; } 2> /dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
