#!/usr/bin/env bash
# Real workloads on a 4-node dyadfs cluster whose shared file system is the bottleneck, each
# run in four configurations side by side:
#   shared     every rank reads the throttled shared FS directly
#   local      every rank reads a local copy on the cache disk directly (the physical limit)
#   dyadfs     every rank reads through its own node's dyadfs mount (4 daemons, 2 racks, UCX tcp),
#              default options (`--replicate auto`: each node copies what the others fetch)
#   nocopy     the same with `--replicate off` (each node caches only what its rank reads)
#   replicate  the same with `--replicate on` (copies up to 90% of the capacity, not half)
#   prefetch   as dyadfs, and each DataLoader rank hands its mount the epoch's file order
#              (examples/python/dyadfs_prefetch.py around its sampler; DLIO runs as dyadfs)
# Workloads: "dataloader" (an unmodified torch DataLoader over npz files, DistributedSampler with
# set_epoch, batch 32, 4 workers, one rank per node) and "dlio" (DLIO unet3d scaled down, pytorch
# reader, 4 MPI ranks one per node; with computation time 0, then the shipped 0.636 s/step).
#
# The shared FS is an ext4 image on a loop device; reads of it are throttled with the cgroup v1
# blkio controller and every process of the run (daemons, ranks) is in that cgroup, so the
# nodes share one bandwidth as on a parallel file system. Each rank runs in a private mount
# namespace with its node's view bound at one path. The page cache is dropped before every
# epoch (the nodes of a real cluster do not share one). Writes the table and plot to OUT.
# Needs root. Idempotent; cleans up after itself (mounts, loop device, cgroup, temp dir).
#
# Usage: scripts/workload.sh
# Env:   THROTTLE_BPS (104857600), THROTTLE_IOPS (0: none), EPOCHS (3), WORKLOADS ("dataloader dlio"),
#        FILES (4096), SIZE (262144), DLIO_FILES (256), DLIO_SIZE (4194304), OUT (docs/workloads),
#        DYADFS_BIN (a dyadfs binary to use instead of building this tree; DYADFS_BIN_NOTE says
#        what it is in the results), DYADFS_VENV (.venv), CONFIGS ("shared local dyadfs
#        nocopy", replicate and prefetch too if named: the configurations to run; fewer for a quick A/B),
#        MOUNT_ARGS (more options for every dyadfs mount, e.g. "--eager-max 1M"),
#        CACHE_FS=ext4 (the nodes' caches and the local copy on a fresh journaled ext4 image on a
#        loop device, not throttled, instead of the temp dir's file system: where that is ext4
#        without a journal, as on the 2-vCPU VM, every new cache file's inode allocation scans
#        for recently deleted inodes and cache-file creates cost more and vary more; the loop
#        device's kernel threads then show as "other CPU", the local copy's reads included)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
ROOT=$PWD
THROTTLE_BPS=${THROTTLE_BPS:-$((100 << 20))}
THROTTLE_IOPS=${THROTTLE_IOPS:-0}
EPOCHS=${EPOCHS:-3}
WORKLOADS=${WORKLOADS:-dataloader dlio}
CONFIGS=${CONFIGS:-shared local dyadfs nocopy}
FILES=${FILES:-4096}
SIZE=${SIZE:-262144}
DLIO_FILES=${DLIO_FILES:-256}
DLIO_SIZE=${DLIO_SIZE:-4194304}
OUT=${OUT:-$ROOT/docs/workloads}
NODES=4
export UCX_TLS=tcp UCX_NET_DEVICES=lo
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }

log "installing what the run needs"
scripts/install-deps.sh
VENV=${DYADFS_VENV:-$ROOT/.venv}
PY=$VENV/bin/python3
for p in openmpi-bin libopenmpi-dev util-linux; do
  dpkg -s "$p" >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$p" >/dev/null
done
# DLIO without its hard dependencies on tensorflow, DALI and torchvision (unused by the
# pytorch/npz path; a stand-in tensorflow module satisfies its imports).
"$PY" -c 'import dlio_benchmark, mpi4py, hydra, matplotlib, dftracer' 2>/dev/null || {
  "$VENV/bin/pip" install -q --no-deps dlio-benchmark==2.0.0
  "$VENV/bin/pip" install -q Pillow PyYAML h5py mpi4py omegaconf pandas psutil pydftracer==1.0.2 \
    hydra-core matplotlib
}
# The binary under test: DYADFS_BIN, else this tree's release build (under the lock the
# project's builds share, so that two builds never run at once).
if [ -n "${DYADFS_BIN:-}" ]; then
  BIN=$DYADFS_BIN
  BUILT=${DYADFS_BIN_NOTE:-"the binary $DYADFS_BIN"}
else
  BUILT="dyadfs built from $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock || echo ' with uncommitted changes')"
  flock /tmp/cargo.lock cargo build --release --quiet
  BIN=$ROOT/target/release/dyadfs
fi

W=$(mktemp -d /var/tmp/dyadfs-workload.XXXX)
. scripts/lib/slow-fs.sh
CPUCG=/sys/fs/cgroup/cpuacct/dyadfs-workload-$$
cleanup() {
  set +e
  for i in $(seq 0 $((NODES - 1))); do unmount_mounted "$W/n$i/mnt"; done
  slow_fs_stop
  if mountpoint -q "$W/disk"; then umount "$W/disk"; fi
  if [ -d "$CPUCG" ]; then
    echo $$ > /sys/fs/cgroup/cpuacct/cgroup.procs
    rmdir "$CPUCG"
  fi
  rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/view" "$OUT"
# Where the nodes' caches and the local copy live (see CACHE_FS).
DISK=$W
if [ "${CACHE_FS:-}" = ext4 ]; then
  DISK=$W/disk
  mkdir -p "$DISK"
  truncate -s $(((NODES + 1) * (FILES * SIZE + 2 * DLIO_FILES * DLIO_SIZE) + (2 << 30))) "$W/cache.img"
  mkfs.ext4 -q -F "$W/cache.img"
  mount -o loop "$W/cache.img" "$DISK"
  mkdir "$DISK/local"
  ln -s disk/local "$W/local"
  log "the nodes' caches and the local copy: a journaled ext4 image on a loop device"
else
  mkdir -p "$W/local"
fi
job_secret "$W/secret"

log "the shared FS: ext4 on a loop device, reads throttled to $((THROTTLE_BPS >> 20)) MiB/s"
slow_fs_start "$W/shared" 12G "$THROTTLE_BPS" "$THROTTLE_IOPS"
# A CPU accounting group for the same processes: CPU time the machine spent outside the run
# during an epoch (another job on the machine) is recorded, so that a disturbed run shows.
mkdir "$CPUCG"
echo $$ > "$CPUCG/cgroup.procs"
RESULTS=$W/results.jsonl

# Check that the throttle bites, for direct and for buffered reads (page cache dropped first),
# from a process of this cgroup; the figures go into the results.
dd if=/dev/zero of="$W/shared/throttle-check" bs=1M count=200 status=none
for flag in direct buffered; do
  drop
  t0=$(now)
  dd if="$W/shared/throttle-check" of=/dev/null bs=1M status=none \
    $([ $flag = direct ] && echo iflag=direct)
  t1=$(now)
  echo "{\"throttle_check\": \"$flag\", \"mib_per_s\": $(echo "200 / ($t1 - $t0)" | bc -l | xargs printf %.1f)}" >> "$RESULTS"
  log "throttle check, $flag reads of 200 MiB: $(tail -1 "$RESULTS")"
done
rm "$W/shared/throttle-check"

PORT=$((21000 + RANDOM % 400 * 10))
for i in $(seq 0 $((NODES - 1))); do
  echo "$i 127.0.0.1:$((PORT + i)) r$((i / 2))"
done > "$W/peers"
# The configurations that run the dyadfs cluster.
is_cluster() { case $1 in dyadfs|nocopy|replicate|prefetch) return 0 ;; esac; return 1; }
# The mount options of a cluster configuration.
replicate_arg() { case $1 in nocopy) echo --replicate=off ;; replicate) echo --replicate=on ;; esac; }
start_cluster() {
  for i in $(seq 0 $((NODES - 1))); do
    rm -rf "$DISK/n$i-ssd"
    mkdir -p "$W/n$i/mnt"
    # shellcheck disable=SC2086 # MOUNT_ARGS is a list of options, split into words
    "$BIN" mount "$W/n$i/mnt" --ssd "$DISK/n$i-ssd" --backing "$W/shared" --node-id "$i" \
      --peers "$W/peers" $(replicate_arg "$1") ${MOUNT_ARGS:-}
  done
}
stop_cluster() {
  for i in $(seq 0 $((NODES - 1))); do fusermount3 -u "$W/n$i/mnt"; done
  sleep 1
}
# Sums of stats keys over the nodes, in the order given; each node's are read at once (with
# --replicate, copies move between two reads).
totals() {
  local i keys="$*"
  for i in $(seq 0 $((NODES - 1))); do
    "$BIN" stats "$W/n$i/mnt" --json |
      "$PY" -c "import json,sys; s = json.load(sys.stdin); print(*(s[k] for k in sys.argv[1:]))" $keys
  done | awk '{for (k = 1; k <= NF; k++) t[k] += $k; n = NF} END {for (k = 1; k <= n; k++) printf "%.0f ", t[k]; print ""}'
}
sources() {
  case $1 in
    shared) echo "$W/shared" ;;
    local) echo "$W/local" ;;
    dyadfs|nocopy|replicate|prefetch) for i in $(seq 0 $((NODES - 1))); do printf '%s ' "$W/n$i/mnt"; done ;;
  esac
}
# CPU ticks the daemons have used, the machine's busy and idle CPU ticks so far, and the run's
# CPU nanoseconds.
daemon_pids() {
  local i
  for i in $(seq 0 $((NODES - 1))); do
    "$BIN" stats "$W/n$i/mnt" --json | "$PY" -c "import json,sys; print(json.load(sys.stdin)['pid'])"
  done
}
cpu() {
  local t=0 p
  for p in $DAEMONS; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t $(awk '/^cpu /{print $2 + $3 + $4 + $7 + $8, $5 + $6}' /proc/stat) $(cat "$CPUCG/cpuacct.usage")"
}
# Per thread group of the daemons (thread names without their number: fuser, control,
# ucx-progress, serve-pull, publisher, readahead...): CPU ticks and context switches so far. A
# thread that ended during the epoch is not counted (daemon_cpu_s, from the processes, is).
threads() {
  local p t
  for p in $DAEMONS; do
    for t in /proc/"$p"/task/*; do
      awk -v n="$(cat "$t/comm" 2>/dev/null)" '{print n, $14 + $15}' "$t/stat" 2>/dev/null | tr '\n' ' '
      awk '/ctxt_switches/ {s += $2} END {print s}' "$t/status" 2>/dev/null
    done
  done | awk 'NF == 3 {sub(/-[0-9]+$/, "", $1); c[$1] += $2; s[$1] += $3}
              END {for (k in c) print k, c[k], s[k]}'
}

# Runs one epoch ("$@" prints the epoch's seconds, samples, AU and, if it can, how busy the CPUs
# were during the epoch), then records it with, for
# dyadfs, where the files came from: opens of complete local copies, bytes pulled from peers,
# bytes read from the shared FS (summed over the nodes), and the CPU time the daemons used; for
# every configuration, how busy the machine's CPUs were (during the epoch if the workload says,
# else during the whole run of its processes, start-up included).
epoch() {
  local workload=$1 cfg=$2 e=$3; shift 3
  local l0=0 p0=0 b0=0 r0=0 l1=0 p1=0 b1=0 r1=0 result d0 d1 busy0 busy1 idle0 idle1 run0 run1
  drop
  if is_cluster "$cfg"; then
    read -r l0 p0 b0 r0 <<< "$(totals local_hits bytes_from_peers bytes_from_backing bytes_replicated)"
  fi
  read -r d0 busy0 idle0 run0 <<< "$(cpu)"
  threads > "$W/threads.0"
  result=$("$@")
  threads > "$W/threads.1"
  read -r d1 busy1 idle1 run1 <<< "$(cpu)"
  if is_cluster "$cfg"; then
    read -r l1 p1 b1 r1 <<< "$(totals local_hits bytes_from_peers bytes_from_backing bytes_replicated)"
  fi
  read -r seconds samples au epoch_busy <<< "$result"
  "$PY" - "$workload" "$cfg" "$e" "$seconds" "$samples" "$au" $((l1 - l0)) $((p1 - p0)) \
    $((b1 - b0)) $((d1 - d0)) $((busy1 - busy0)) $((idle1 - idle0)) "${epoch_busy:-}" $((run1 - run0)) \
    "$W/threads.0" "$W/threads.1" $((r1 - r0)) >> "$RESULTS" <<'PY'
import json, os, sys
(w, cfg, e, s, n, au, local, peer, backing, daemon, busy, idle, epoch_busy, run, t0, t1,
 replicated) = sys.argv[1:]
hz = os.sysconf("SC_CLK_TCK")
row = {"workload": w, "config": cfg, "epoch": int(e), "seconds": float(s), "samples": int(n),
       "samples_per_s": round(int(n) / float(s), 1),
       "cpu_busy_percent": float(epoch_busy) if epoch_busy else
       round(100 * int(busy) / max(1, int(busy) + int(idle)), 1),
       "cpu_busy_during": "epoch" if epoch_busy else "run",
       # CPU time of processes outside the run (and of kernel threads) while the epoch's
       # processes ran: about 0 on an otherwise idle machine.
       "other_cpu_s": round(max(0.0, int(busy) / hz - int(run) / 1e9), 2)}
if au != "-":
    row["au_percent"] = float(au)
if cfg in ("dyadfs", "nocopy", "replicate", "prefetch"):
    # peer: all bytes pulled from other nodes' caches, those replication copied included.
    row.update(local_hits=int(local), peer=int(peer), backing=int(backing),
               replicated=int(replicated), daemon_cpu_s=round(int(daemon) / hz, 2))
    # Where the daemons' CPU went, per thread group: CPU seconds and context switches.
    def load(f):
        return {k: (int(c), int(x)) for k, c, x in (l.split() for l in open(f))}
    before, after = load(t0), load(t1)
    row["daemon_threads"] = {
        k: {"cpu_s": round((c - before.get(k, (0, 0))[0]) / hz, 2),
            "switches": x - before.get(k, (0, 0))[1]}
        for k, (c, x) in sorted(after.items())
        if c - before.get(k, (0, 0))[0] or x - before.get(k, (0, 0))[1]}
print(json.dumps(row))
PY
  log "$workload $cfg epoch $e: $(tail -1 "$RESULTS")"
  "$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); sys.exit(r["other_cpu_s"] > 1)' \
    "$(tail -1 "$RESULTS")" || log "WARNING: other processes used the CPUs during this epoch"
}

# Workload 1: one train.py rank per node, all at once (they start the epoch together, once all
# have imported torch); prints "seconds samples - cpu-busy%" (the slowest rank's epoch).
dataloader_epoch() {
  local srcs=$1 e=$2 i barrier
  barrier=$(mktemp -d "$W/barrier.XXXX")
  for i in $(seq 0 $((NODES - 1))); do
    RANK=$i scripts/workload/in_view.sh "$srcs" "$W/view" "$PY" scripts/workload/train.py \
      --data "$W/view/dl" --rank "$i" --world $NODES --first-epoch "$e" --barrier "$barrier" \
      $([ "$CFG" = prefetch ] && echo --prefetch) > "$W/rank$i.json" &
  done
  wait
  cat "$W"/rank*.json | "$PY" -c '
import json, sys
r = [json.loads(l) for l in sys.stdin]
last = max(r, key=lambda x: x["seconds"])
print(last["seconds"], sum(x["samples"] for x in r), "-", last["cpu_busy_percent"])'
}

# Workload 2: DLIO over 4 MPI ranks (one per node view), one epoch per run so the page cache
# can be dropped in between; prints "seconds samples au%".
dlio_epoch() {
  local srcs=$1 e=$2 compute=$3 out=$W/dlio-out-$RANDOM
  # From $W: DLIO writes its logs into the working directory.
  (cd "$W" && mpirun --allow-run-as-root --oversubscribe -np $NODES \
    --mca btl self,vader --mca oob_tcp_if_include lo \
    -x PYTHONPATH="$ROOT/scripts/workload/standins" \
    "$ROOT/scripts/workload/in_view.sh" "$srcs" "$W/view" "$VENV/bin/dlio_benchmark" \
    "${DLIO_ARGS[@]}" ++workload.workflow.generate_data=False ++workload.workflow.train=True \
    ++workload.train.epochs=1 ++workload.train.computation_time="$compute" \
    ++workload.dataset.data_folder="$W/view/unet3d" hydra.run.dir="$out" > "$out.log" 2>&1) \
    || { tail -30 "$out.log" >&2; return 1; }
  "$PY" - "$out" <<'PY'
import json, sys
d = sys.argv[1]
epoch = json.load(open(f"{d}/per_epoch_stats.json"))["1"]
summary = json.load(open(f"{d}/summary.json"))
m = summary["metric"]
seconds = float(epoch["duration"])
# DLIO's throughput is over all ranks; whole batches only, so not every file is read.
samples = round(m["train_throughput_samples_per_second"][0] * seconds)
print(seconds, samples, round(m["train_au_percentage"][0], 2))
PY
}
DLIO_ARGS=(workload=unet3d_a100 ++workload.workflow.checkpoint=False
  ++workload.dataset.num_files_train="$DLIO_FILES" ++workload.dataset.record_length="$DLIO_SIZE"
  ++workload.dataset.record_length_stdev=$((DLIO_SIZE / 4))
  ++workload.dataset.record_length_resize="$DLIO_SIZE")

for workload in $WORKLOADS; do
  case $workload in
    dataloader)
      log "generating $FILES npz files of $SIZE bytes (shared FS and local copy)"
      "$PY" scripts/workload/dataset.py "$W/shared/dl" "$FILES" "$SIZE"
      "$PY" scripts/workload/dataset.py "$W/local/dl" "$FILES" "$SIZE"
      runs=("dataloader dataloader_epoch")
      ;;
    dlio)
      log "generating the DLIO unet3d dataset: $DLIO_FILES files of ~$DLIO_SIZE bytes"
      for d in shared local; do
        (cd "$W" && PYTHONPATH="$ROOT/scripts/workload/standins" "$VENV/bin/dlio_benchmark" \
          "${DLIO_ARGS[@]}" ++workload.workflow.generate_data=True ++workload.workflow.train=False \
          ++workload.dataset.data_folder="$W/$d/unet3d" hydra.run.dir="$W/dlio-gen-$d" > "$W/dlio-gen-$d.log" 2>&1)
      done
      runs=("dlio dlio_epoch 0" "dlio-compute dlio_epoch 0.636")
      ;;
    *) echo "unknown workload $workload" >&2; exit 2 ;;
  esac
  for run in "${runs[@]}"; do
    read -r name fn compute <<< "$run"
    for cfg in $CONFIGS; do
      CFG=$cfg
      DAEMONS=
      is_cluster "$cfg" && start_cluster "$cfg" && DAEMONS=$(daemon_pids)
      for e in $(seq 1 "$EPOCHS"); do
        epoch "$name" "$cfg" "$e" $fn "$(sources $cfg)" "$((e - 1))" ${compute:+"$compute"}
      done
      is_cluster "$cfg" && stop_cluster
    done
  done
done

mkdir -p "$OUT" && cp "$RESULTS" "$OUT/results.jsonl"
"$PY" scripts/workload/report.py "$RESULTS" "$OUT" \
  "THROTTLE_BPS=$THROTTLE_BPS THROTTLE_IOPS=$THROTTLE_IOPS EPOCHS=$EPOCHS FILES=$FILES SIZE=$SIZE DLIO_FILES=$DLIO_FILES DLIO_SIZE=$DLIO_SIZE scripts/workload.sh" \
  "$BUILT, $(nproc) CPUs, $(free -g | awk '/^Mem:/{print $2}') GiB"
log "results: $OUT/results.md, $OUT/epochs.png"
