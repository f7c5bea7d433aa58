#!/usr/bin/env bash
# Random reads into a large file (issue 50), side by side in one run: COUNT reads of LEN bytes at
# random offsets (one seed per run, the same for both) into one file of SIZE bytes, (a) through
# a fresh single-node mount (empty cache: the first epoch) and (b) directly from the shared
# directory, alternating run by run, the page cache dropped before each. MODE=pread reads with
# os.pread; MODE=mmap touches the same ranges of an mmap of the file (as LMDB or np.memmap do).
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
# Needs root (drop_caches). Usage: scripts/bench_random.sh (env: RUNS, SIZE, LEN, COUNT, MODE,
# MIBS, ADVICE, MOUNT_ARGS, DYADFS_BIN)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-3} SIZE=${SIZE:-1536M} LEN=${LEN:-262144} COUNT=${COUNT:-1000} MODE=${MODE:-pread}
build_dyadfs
W=$(mktemp -d /var/tmp/dyadfs-random-bench.XXXX)
. scripts/lib/slow-fs.sh
cleanup() {
  unmount_mounted "$W/mnt"
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
echo "writing a $SIZE file into the shared directory"
head -c "$bytes" /dev/urandom > "$W/backing/big.bin"
# reads DIR SEED: the run's reads of DIR/big.bin; prints the seconds they took and the bytes
# they touch.
reads() {
  python3 - "$1/big.bin" "$2" "$LEN" "$COUNT" "$MODE" "${ADVICE:-}" <<'PY'
import mmap, os, random, sys, time
path, seed, length, count, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
random_advice = sys.argv[6] == "random"
size = os.path.getsize(path)
rng = random.Random(seed)
offsets = [rng.randrange(0, size - length) for _ in range(count)]
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
for r in $(seq "$RUNS"); do
  seed=$((1000 + r))
  drop
  # A fresh mount and an empty cache every run: each is a first epoch.
  rm -rf "$W/ssd"; mkdir "$W/ssd"
  # shellcheck disable=SC2086 # MOUNT_ARGS is a list of options
  "$BIN" mount "$W/mnt" --ssd "$W/ssd" --backing "$W/backing" ${MOUNT_ARGS:-}
  read -r t touched < <(reads "$W/mnt" "$seed")
  fetched=$(dyadfs_stat "$W/mnt" bytes_from_backing)
  unmount_mounted "$W/mnt"
  wait_daemons_gone "$W"
  drop
  read -r td _ < <(reads "$W/backing" "$seed")
  awk -v r="$r" -v t="$t" -v td="$td" -v touched="$touched" -v f="$fetched" 'BEGIN {
    printf "run %d  dyadfs %.2f s, fetched %.0f MiB for %.0f MiB touched (%.2fx)  direct %.2f s  dyadfs/direct %.2f\n",
      r, t, f / 1048576, touched / 1048576, f / touched, td, t / td }' | tee -a "$W/runs.txt"
done
echo "$SIZE file, $COUNT $MODE reads of $LEN bytes, page cache dropped${MIBS:+, shared directory throttled to $MIBS MiB/s}${ADVICE:+, reader advice $ADVICE}, medians of $RUNS runs:"
awk '{print $13}' "$W/runs.txt" | tr -d '(x)' | median | awk '{printf "  fetched / touched %.2fx\n", $1}'
awk '{print $NF}' "$W/runs.txt" | median | awk '{printf "  dyadfs / direct    %.2f\n", $1}'
