#!/usr/bin/env bash
# Random reads into a large file (issue 50), side by side in one run: COUNT reads of LEN bytes at
# random offsets (one seed per run, the same for both) into one file of SIZE bytes, (a) through
# a fresh single-node mount (empty cache: the first epoch) and (b) directly from the shared
# directory, alternating run by run, the page cache dropped before each. MODE=pread reads with
# os.pread; MODE=mmap touches the same ranges of an mmap of the file (as LMDB or np.memmap do).
# MODE=stream reads the first COUNT x LEN bytes in order instead, LEN bytes a call through
# Python's buffered open (a line reader, tarfile, pickle: small reads of a large file in order);
# MODE=rawstream the same with os.read (GNU tar's 10 KiB reads, dd bs=...). MODE=h5py makes the
# file an HDF5 file of one contiguous dataset of SIZE/LEN rows of LEN bytes (h5py, installed
# from Debian's python3-h5py if missing) and reads COUNT random rows by index through h5py (as a
# Dataset's __getitem__ does): HDF5's own reads of its metadata and rows.
# Per run: the time, the bytes the reads touch, and for the mount the bytes it fetched from the
# shared directory (`bytes_from_backing`) over those touched: what a first epoch of random
# reads costs the shared file system. Defaults: a 1.5 GiB file, 1000 reads of 256 KiB; for an
# LMDB-like file, SIZE=2G LEN=112640 COUNT=2000 MODE=mmap.
# MIBS=N puts the shared directory on the scripts' slow shared file system (an ext4 image on a
# loop device whose reads are throttled to N MiB/s for the readers and the daemon alike, as in
# scripts/demo.sh): then the time ratio is issue 50's other target (at most 1.1x the direct
# reads); without it the shared directory is this machine's own disk and only the bytes count.
# ADVICE=random has the reader say it reads at random (posix_fadvise POSIX_FADV_RANDOM for
# pread, madvise MADV_RANDOM for mmap), through the mount and directly alike: the kernel then
# reads no further ahead than each read.
# EPOCH2=1 measures the next epoch on another node instead: two nodes on 127.0.0.1 (UCX over
# tcp on loopback), node A reads the run's records (its first epoch), then node B reads the same
# records (a DataLoader's next epoch gives them to another rank): per run, B's bytes pulled
# from peers and fetched from the shared directory over the bytes touched, and both times.
# SPARSE=1 makes the file a hole of SIZE bytes (no disk, no write time) instead of random bytes:
# with a large SIZE and small LEN, many chunks with a page or two each, to see what their page
# tables cost the daemon (each run prints its anonymous memory before and after the reads, and
# `partial_chunks`).
# Needs root (drop_caches). Usage: scripts/bench_random.sh (env: RUNS, SIZE, LEN, COUNT, MODE,
# MIBS, ADVICE, EPOCH2, SPARSE, MOUNT_ARGS, DYADFS_BIN)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-3} SIZE=${SIZE:-1536M} LEN=${LEN:-262144} COUNT=${COUNT:-1000} MODE=${MODE:-pread}
# The Python that reads (and for MODE=h5py writes) the file: Debian's, which python3-h5py serves.
PY=python3
if [ "$MODE" = h5py ]; then
  PY=/usr/bin/python3
  "$PY" -c 'import h5py' 2>/dev/null || apt-get install -y --no-install-recommends python3-h5py
fi
build_dyadfs
W=$(mktemp -d /var/tmp/dyadfs-random-bench.XXXX)
. scripts/lib/slow-fs.sh
cleanup() {
  unmount_mounted "$W/mnt" "$W"/{a,b}/mnt
  wait_daemons_gone "$W"
  slow_fs_stop
  rm -rf "$W"
}
trap cleanup EXIT
bytes=$(numfmt --from=iec "$SIZE")
if [ -n "${MIBS:-}" ]; then
  # Room for the file and ext4's own: the image is sparse, so only what is written counts.
  slow_fs_start "$W/backing" $((bytes + (bytes >> 3) + (64 << 20))) $((MIBS << 20))
  echo "the shared directory: ext4 on a loop device, reads throttled to $MIBS MiB/s"
fi
mkdir -p "$W/backing" "$W/mnt"
if [ "$MODE" = h5py ]; then
  echo "writing a $SIZE HDF5 file of $((bytes / LEN)) rows of $LEN bytes into the shared directory"
  "$PY" - "$W/backing/big.bin" "$bytes" "$LEN" <<'PY'
import os, sys, h5py, numpy as np
path, size, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = size // length
with h5py.File(path, "w") as f:
    d = f.create_dataset("rows", shape=(rows, length), dtype="u1")  # contiguous
    step = max(1, (64 << 20) // length)
    for at in range(0, rows, step):
        n = min(step, rows - at)
        d[at:at + n] = np.frombuffer(os.urandom(n * length), dtype="u1").reshape(n, length)
PY
elif [ -n "${SPARSE:-}" ]; then
  truncate -s "$bytes" "$W/backing/big.bin"
else
  echo "writing a $SIZE file into the shared directory"
  head -c "$bytes" /dev/urandom > "$W/backing/big.bin"
fi
# rss_anon PID: the process's anonymous memory in KiB (its heap: what page tables cost).
rss_anon() { awk '/^RssAnon/ {print $2}' /proc/"$1"/status; }
# reads DIR SEED: the run's reads of DIR/big.bin; prints the seconds they took and the bytes
# they touch.
reads() {
  "$PY" - "$1/big.bin" "$2" "$LEN" "$COUNT" "$MODE" "${ADVICE:-}" <<'PY'
import mmap, os, random, sys, time
path, seed, length, count, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
random_advice = sys.argv[6] == "random"
size = os.path.getsize(path)
rng = random.Random(seed)
if mode == "h5py":
    import h5py
    t = time.perf_counter()
    with h5py.File(path, "r") as f:
        d = f["rows"]
        rows = [rng.randrange(0, d.shape[0]) for _ in range(count)]
        for i in rows:
            assert d[i].nbytes == length
    print(f"{time.perf_counter() - t:.3f} {count * length}")
    sys.exit(0)
offsets = [rng.randrange(0, size - length) for _ in range(count)]
if mode in ("stream", "rawstream"):
    t = time.perf_counter()
    with open(path, "rb", buffering=-1 if mode == "stream" else 0) as f:
        for _ in range(count):
            assert len(f.read(length)) == length
    print(f"{time.perf_counter() - t:.3f} {count * length}")
    sys.exit(0)
fd = os.open(path, os.O_RDONLY)
t = time.perf_counter()
if random_advice:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
if mode == "mmap":
    m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    if random_advice:
        m.madvise(mmap.MADV_RANDOM)
    for off in offsets:
        m[off:off + length]
    m.close()
else:
    for off in offsets:
        assert len(os.pread(fd, length, off)) == length
took = time.perf_counter() - t
os.close(fd)
print(f"{took:.3f} {count * length}")
PY
}
if [ -n "${EPOCH2:-}" ]; then
  export UCX_TLS=tcp UCX_NET_DEVICES=lo
  job_secret "$W/secret"
  PORT=$((9000 + RANDOM % 1000))
  printf '0 127.0.0.1:%d r0\n1 127.0.0.1:%d r0\n' $PORT $((PORT + 1)) > "$W/peers"
  mkdir -p "$W"/{a,b}/mnt
  for r in $(seq "$RUNS"); do
    seed=$((1000 + r))
    rm -rf "$W"/{a,b}/ssd
    mount_node a 0
    mount_node b 1
    drop
    read -r ta touched < <(reads "$W/a/mnt" "$seed")
    fetched_a=$(dyadfs_stat "$W/a/mnt" bytes_from_backing)
    # A's partial copy is published within a few milliseconds of its first pages.
    sleep 1
    drop
    read -r tb _ < <(reads "$W/b/mnt" "$seed")
    pulled=$(dyadfs_stat "$W/b/mnt" bytes_from_peers)
    fetched_b=$(dyadfs_stat "$W/b/mnt" bytes_from_backing)
    refused=$(dyadfs_stat "$W/b/mnt" pulls_refused 2>/dev/null || echo 0)
    unmount_mounted "$W"/{a,b}/mnt
    wait_daemons_gone "$W"
    awk -v r="$r" -v ta="$ta" -v tb="$tb" -v touched="$touched" -v fa="$fetched_a" -v p="$pulled" \
      -v fb="$fetched_b" -v x="$refused" 'BEGIN {
      printf "run %d  A (epoch 1) %.2f s, fetched %.2fx  B (epoch 2) %.2f s, pulled %.2fx, fetched %.0f MiB, %d pulls refused\n",
        r, ta, fa / touched, tb, p / touched, fb / 1048576, x }' | tee -a "$W/runs.txt"
  done
  echo "$SIZE file, $COUNT $MODE reads of $LEN bytes on node A then the same on node B, page cache dropped${MIBS:+, shared directory throttled to $MIBS MiB/s}${ADVICE:+, reader advice $ADVICE}, medians of $RUNS runs:"
  awk '{print $16}' "$W/runs.txt" | tr -d 'x,' | median | awk '{printf "  B pulled / touched %.2fx\n", $1}'
  awk '{print $18}' "$W/runs.txt" | median | awk '{printf "  B fetched from the shared directory %.0f MiB\n", $1}'
  exit 0
fi
for r in $(seq "$RUNS"); do
  seed=$((1000 + r))
  drop
  # A fresh mount and an empty cache every run: each is a first epoch.
  rm -rf "$W/ssd"; mkdir "$W/ssd"
  # shellcheck disable=SC2086 # MOUNT_ARGS is a list of options
  "$BIN" mount "$W/mnt" --ssd "$W/ssd" --backing "$W/backing" ${MOUNT_ARGS:-}
  pid=$(dyadfs_stat "$W/mnt" pid)
  rss0=$(rss_anon "$pid")
  read -r t touched < <(reads "$W/mnt" "$seed")
  fetched=$(dyadfs_stat "$W/mnt" bytes_from_backing)
  echo "run $r  daemon anonymous memory $rss0 -> $(rss_anon "$pid") KiB, $(dyadfs_stat "$W/mnt" partial_chunks 2>/dev/null || echo '?') chunks partly cached"
  # What the cache's header log took for this epoch's fills (written on the cache disk).
  log=$(stat -c %s "$W/ssd/index.log")
  unmount_mounted "$W/mnt"
  wait_daemons_gone "$W"
  drop
  read -r td _ < <(reads "$W/backing" "$seed")
  awk -v r="$r" -v t="$t" -v td="$td" -v touched="$touched" -v f="$fetched" -v logb="$log" 'BEGIN {
    printf "run %d  dyadfs %.2f s, fetched %.0f MiB for %.0f MiB touched (%.2fx), cache log %.0f KiB  direct %.2f s  dyadfs/direct %.2f\n",
      r, t, f / 1048576, touched / 1048576, f / touched, logb / 1024, td, t / td }' | tee -a "$W/runs.txt"
done
echo "$SIZE file, $COUNT $MODE reads of $LEN bytes, page cache dropped${MIBS:+, shared directory throttled to $MIBS MiB/s}${ADVICE:+, reader advice $ADVICE}, medians of $RUNS runs:"
awk '{print $13}' "$W/runs.txt" | tr -d '(x),' | median | awk '{printf "  fetched / touched %.2fx\n", $1}'
awk '{print $NF}' "$W/runs.txt" | median | awk '{printf "  dyadfs / direct    %.2f\n", $1}'
