#!/usr/bin/env bash
# Small-file pull benchmark, side by side in one run (medians of RUNS runs): FILES files of SIZE
# bytes read whole, in shuffled order by 4 processes, (a) from a local copy on the same disk and
# (b) through node B's mount while only node A (other rack) holds them, so every file is
# located, pulled over UCX, written to B's cache and published; and (c) B mounted empty with
# --replicate, copying every file A holds without being read (timed from the mount until B
# has them all; B's CPU counted from its start). The page cache is dropped before each run.
# Reports files/s and the CPU both daemons spend per file: that CPU is what the training input
# pipeline competes with on a busy node (docs/workloads.md).
# EAGER lists values of `mount --eager-max` to compare, interleaved run by run (default
# "0 1M": every chunk by RMA get, and chunks up to the mount's default inline in the holder's
# reply).
# PTMIN lists values of `mount --passthrough-min` for the pulled reads, likewise (default "0",
# the mount's default: a pulled small file is fetched whole at open and handed to the kernel by
# passthrough; "1M": served by B's daemon, pages kept).
# CACHE_FS=ext4 puts B's cache (and A's, and the fills' node's, and the floor's files) on a
# fresh journaled ext4 image on a loop device instead of the directory's own file system (where
# that is ext4 without a journal, as on the 2-vCPU VM, every new cache file's inode allocation
# scans for recently deleted inodes: a cost of that machine).
# HINT lists whether B is handed the readers' order first (`dyadfs prefetch --list`, timed with
# the reads): default "0"; "0 1" compares demand pulls with pulls ahead of the readers.
# FILLS=1 adds (d): each build in BINS mounted alone (no peers) over an empty cache, timed
# filling every file from the shared FS for the readers, with its CPU per file.
# BOPTS lists option sets for B's mount, separated by ';' (default: one empty set), e.g.
# ";--no-open" compares the default with --no-open, interleaved like the rest.
# BINS lists dyadfs builds (e.g. two commits'), interleaved run by run with each other and the
# options above, each entry a binary with optional mount options after a colon
# ("new/dyadfs:--data-plane=ucx,--ucx-over-tcp"); A, the holder, is remounted with the entry B runs (builds of
# other protocol versions cannot talk to each other).
# FLOOR=1 adds (e): examples/pull_floor.rs on B's cache file system each run, the same files'
# bytes moved with no dyadfs in the way (loopback TCP, a thread pair per reader; see
# scripts/bench_floor.sh), one cost added at a time, each side's context switches counted, one
# row with the holder in a process of its own: what the figures above cannot go below;
# and examples/fuse_floor.rs mounted over the local copy and read by the same readers: what the
# kernel's FUSE requests of each file (LOOKUP, OPEN, IOCTL, RELEASE) cost a daemon that does
# nothing else (its CPU per file in the puller's column), the floor under a hit and under the
# FUSE part of a pull.
# SETTLE (seconds, default 2): how long B is left after its mount before its reads are timed,
# so that what its start costs both nodes is not counted per file (0: counted).
# HITS=1 (the default with FLOOR=1) reads B's files once more after each pulled run, the page
# cache and the kernel's dentries dropped: every file a cached hit, beside the FUSE floor.
# Needs root. Usage: scripts/bench_small_pull.sh   (env: RUNS, FILES, SIZE, UCX_TLS, EAGER, PTMIN,
# CACHE_FS, BINS, HINT, BOPTS, FILLS, FLOOR, HITS, SETTLE, READER=python for Python readers
# instead of `cat`s, REPLICATE=0 to leave out (c))
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-5} FILES=${FILES:-2048} SIZE=${SIZE:-262144} EAGER=${EAGER:-0 1M} PTMIN=${PTMIN:-0}
HINT=${HINT:-0}
IFS=';' read -r -a BOPTS <<< "${BOPTS:-}"
[ "${#BOPTS[@]}" -gt 0 ] || BOPTS=("")
# What each configuration is called in the results, in the order they first ran.
declare -A LABEL
KEYS=()
export UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
build_dyadfs
[ "${FLOOR:-0}" != 1 ] || build_examples pull_floor fuse_floor
read -r -a BINS <<< "${BINS:-$BIN}"
W=$(mktemp -d /var/tmp/dyadfs-small-bench.XXXX)
cleanup() {
  unmount_mounted "$W"/{a,b,c,f}/mnt
  for m in "$W"/{a,b}/ssd; do if mountpoint -q "$m"; then umount "$m"; fi; done
  rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W"/{backing,local} "$W"/{a,b,f}/mnt "$W"/{a,b}/ssd
if [ "${CACHE_FS:-}" = ext4 ]; then
  truncate -s $((FILES * SIZE * 5 + (1 << 30))) "$W/cache.img"
  mkfs.ext4 -q -F "$W/cache.img"
  mount -o loop "$W/cache.img" "$W/b/ssd"
  # A's cache on the same file system (a directory of it), as the floor's holder reads its
  # files there: the two holders' reads then cost the same per byte.
  mkdir "$W/b/ssd/holder"
  mount --bind "$W/b/ssd/holder" "$W/a/ssd"
fi
# B starts each run with an empty cache (the floor's files and A's cache, on the same file
# system, stay).
empty_b() { find "$W/b/ssd" -mindepth 1 -maxdepth 1 ! -name floor ! -name holder -exec rm -rf {} +; }
job_secret "$W/secret"
python3 - "$W/backing" "$FILES" "$SIZE" <<'PY'
import os, sys
for i in range(int(sys.argv[2])):
    open(os.path.join(sys.argv[1], f"{i:05}.bin"), "wb").write(os.urandom(int(sys.argv[3])))
PY
cp -r "$W/backing/." "$W/local/"
(cd "$W/backing" && ls) | shuf > "$W/order"
PORT=$((9000 + RANDOM % 1000))
printf '0 127.0.0.1:%d r0\n1 127.0.0.1:%d r1\n' $PORT $((PORT + 1)) > "$W/peers"
daemon_of() { pgrep -f -- " mount $W/$1/mnt "; }
# The option that keeps a build from replicating on its own: --replicate=off where the build
# has it (replication by default came with issue 70), nothing for older builds.
no_replication() { if "$1" mount --help 2>&1 | grep -q -- '--replicate'; then echo --replicate=off; fi; }
cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) * 1000 / hz}' "/proc/$1/stat"; }
# Reads every file in $W/order under $1 whole, 4 processes: `cat`s, or (READER=python) 4 Python
# processes each reading its quarter with `open(path, "rb").read()`, as a DataLoader's workers do.
if [ "${READER:-cat}" = python ]; then
  read_all() {
    python3 - "$1" "$W/order" <<'PY'
import os, sys
root, names = sys.argv[1], open(sys.argv[2]).read().split()
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
else
  read_all() { (cd "$1" && xargs -P4 -n 64 cat < "$W/order" > /dev/null); }
fi

remount_holder "${BINS[0]}"
read_all "$W/a/mnt"    # node A fetches everything from the shared FS
# Appends a run's figures to the files of $1 (files/s, CPU and switches per file of A and B).
record() {
  local k=$1 t0=$2 t1=$3
  echo "$(echo "$FILES / ($t1 - $t0)" | bc -l)" >> "$W/$k.txt"
  echo "$(echo "($a1 - $a0) * 1000 / $FILES" | bc -l)" >> "$W/$k.cpu_a.txt"
  echo "$(echo "($b1 - $b0) * 1000 / $FILES" | bc -l)" >> "$W/$k.cpu_b.txt"
  echo "$(echo "($sa1 - $sa0) / $FILES" | bc -l)" >> "$W/$k.sw_a.txt"
  echo "$(echo "($sb1 - $sb0) / $FILES" | bc -l)" >> "$W/$k.sw_b.txt"
}
stat_b() { dyadfs_stat "$W/b/mnt" "$1"; }
for _ in $(seq "$RUNS"); do
  drop
  t0=$(now); read_all "$W/local"; t1=$(now)
  echo "$(echo "$FILES / ($t1 - $t0)" | bc -l)" >> "$W/local.txt"

  if [ "${FLOOR:-0}" = 1 ]; then
    # One run of each of the floor's configurations: "run 1 NAME N files/s holder X us/file
    # S switches  puller Y us/file T switches".
    n=0
    while IFS='|' read -r name rate holder hsw puller psw; do
      n=$((n + 1)) k="floor-$n"
      [ -n "${LABEL[$k]:-}" ] || { LABEL[$k]="floor: $name"; KEYS+=("$k"); }
      echo "$rate" >> "$W/$k.txt"; echo "$holder" >> "$W/$k.cpu_a.txt"
      echo "$puller" >> "$W/$k.cpu_b.txt"
      echo "$hsw" >> "$W/$k.sw_a.txt"; echo "$psw" >> "$W/$k.sw_b.txt"
    done < <(target/release/examples/pull_floor "$W/b/ssd/floor" "$FILES" "$SIZE" 4 1 |
      sed -nE 's#^run 1 (.*[^ ]) +([0-9]+) files/s +holder +([0-9.]+) us/file +([0-9.]+) switches +puller +([0-9.]+) us/file +([0-9.]+) switches$#\1|\2|\3|\4|\5|\6#p')
    [ "$n" -gt 0 ] || { echo "pull_floor reported nothing" >&2; exit 1; }
    # The FUSE requests alone: examples/fuse_floor.rs, a daemon answering the readers' LOOKUP,
    # OPEN (passthrough), IOCTL and RELEASE of each file of the local copy and nothing else.
    target/release/examples/fuse_floor "$W/local" "$W/f/mnt" &
    F=$!
    until mountpoint -q "$W/f/mnt"; do kill -0 "$F" || exit 1; sleep 0.05; done
    drop
    a0=0 a1=0 sa0=0 sa1=0 b0=$(cpu_ms "$F") sb0=$(switches "$F")
    t0=$(now); read_all "$W/f/mnt"; t1=$(now)
    b1=$(cpu_ms "$F") sb1=$(switches "$F")
    fusermount3 -u "$W/f/mnt"; wait "$F"
    k=floor-fuse
    [ -n "${LABEL[$k]:-}" ] || { LABEL[$k]="floor: FUSE requests alone, passthrough"; KEYS+=("$k"); }
    record "$k" "$t0" "$t1"
  fi

  if [ "${FILLS:-0}" = 1 ]; then
    for i in "${!BINS[@]}"; do
      # A node of its own, mounted empty: every file is read from the shared FS and cached.
      # (On B's cache file system, whose daemon is not mounted now, where CACHE_FS says.)
      CSSD=$W/c/ssd; [ -z "${CACHE_FS:-}" ] || CSSD=$W/b/ssd/fill
      rm -rf "$W/c" "$CSSD"; mkdir -p "$W/c/mnt" "$CSSD"
      "$(bin_of "${BINS[$i]}")" mount "$W/c/mnt" --ssd "$CSSD" --backing "$W/backing"
      drop
      C=$(daemon_of c) a0=0 a1=0 sa0=0 sa1=0
      b0=$(cpu_ms "$C") sb0=$(switches "$C")
      t0=$(now); read_all "$W/c/mnt"; t1=$(now)
      b1=$(cpu_ms "$C") sb1=$(switches "$C")
      fusermount3 -u "$W/c/mnt"; rm -rf "$CSSD"
      k="fill-$i"
      [ -n "${LABEL[$k]:-}" ] || { LABEL[$k]="filled from the shared FS${BINS[1]:+, B$i}"; KEYS+=("$k"); }
      record "$k" "$t0" "$t1"
    done
  fi

  for e in $EAGER; do
   for p in $PTMIN; do
    for i in "${!BINS[@]}"; do
    for h in $HINT; do
    for o in "${!BOPTS[@]}"; do
    # B restarts empty; A re-announces its copies to B's tables as B starts.
    remount_holder "${BINS[$i]}"
    empty_b
    # Replication off on B (a build that replicates by default would otherwise copy A's files in
    # the settle time, and the reads would be hits, not pulls); the --replicate run measures it.
    BIN=$(bin_of "${BINS[$i]}") BIN_ARGS=$(args_of "${BINS[$i]}") MOUNT_ARGS="${MOUNT_ARGS:-} --eager-max $e --passthrough-min $p $(no_replication "$(bin_of "${BINS[$i]}")") ${BOPTS[$o]}" \
      mount_node b 1
    # B's start (A re-announcing its copies to B's tables, B's first reads of the holders'
    # feeds) is not a cost of the reads: a training job starts its daemons once.
    sleep "${SETTLE:-2}"
    drop
    A=$(daemon_of a) B=$(daemon_of b)
    a0=$(cpu_ms "$A") b0=$(cpu_ms "$B") sa0=$(switches "$A") sb0=$(switches "$B")
    t0=$(now)
    if [ "$h" = 1 ]; then "$(bin_of "${BINS[$i]}")" prefetch "$W/b/mnt" --list "$W/order" > /dev/null; fi
    read_all "$W/b/mnt"; t1=$(now)
    sleep 0.5   # publishes trail the reads
    a1=$(cpu_ms "$A") b1=$(cpu_ms "$B") sa1=$(switches "$A") sb1=$(switches "$B")
    peers=$(stat_b bytes_from_peers)
    [ "$peers" = $((FILES * SIZE)) ] || { echo "node B pulled $peers bytes, expected $((FILES * SIZE))" >&2; exit 1; }
    k="dyadfs-$e-$p-$i-$h-$o"
    if [ -z "${LABEL[$k]:-}" ]; then
      LABEL[$k]="pulled, eager $e, pt-min $p${BINS[1]:+, B$i}${BOPTS[$o]:+, ${BOPTS[$o]}}"
      [ "$h" = 1 ] && LABEL[$k]+=", order handed over"
      KEYS+=("$k")
    fi
    record "$k" "$t0" "$t1"
    if [ "${HITS:-${FLOOR:-0}}" = 1 ]; then
      # The same files again from B's cache, the page cache (and the kernel's dentries) dropped.
      drop
      a0=$(cpu_ms "$A") b0=$(cpu_ms "$B") sa0=$(switches "$A") sb0=$(switches "$B")
      t0=$(now); read_all "$W/b/mnt"; t1=$(now)
      a1=$(cpu_ms "$A") b1=$(cpu_ms "$B") sa1=$(switches "$A") sb1=$(switches "$B")
      [ "$(stat_b bytes_from_peers)" = "$peers" ] || { echo "node B pulled again on its hits" >&2; exit 1; }
      [ -n "${LABEL[$k-hit]:-}" ] || { LABEL[$k-hit]="  the same, hits"; KEYS+=("$k-hit"); }
      record "$k-hit" "$t0" "$t1"
    fi
    fusermount3 -u "$W/b/mnt"; sleep 0.3
    done
    done
    done
   done

    # B restarts empty with --replicate and copies everything A holds without being read.
    [ "${REPLICATE:-1}" = 1 ] || continue
    remount_holder "$BIN"
    empty_b; drop
    A=$(daemon_of a)
    a0=$(cpu_ms "$A") sa0=$(switches "$A")
    t0=$(now); MOUNT_ARGS="${MOUNT_ARGS:-} --eager-max $e --replicate" mount_node b 1
    B=$(daemon_of b) b0=0 sb0=0
    until [ "$(stat_b replicated_files)" = "$FILES" ]; do sleep 0.1; done
    t1=$(now)
    a1=$(cpu_ms "$A") b1=$(cpu_ms "$B") sa1=$(switches "$A") sb1=$(switches "$B")
    fusermount3 -u "$W/b/mnt"; sleep 0.3
    k="replicate-$e"
    [ -n "${LABEL[$k]:-}" ] || { LABEL[$k]="--replicate, eager $e"; KEYS+=("$k"); }
    record "$k" "$t0" "$t1"
  done
done
runs() { xargs printf '%.0f ' < "$1"; }
printf '%d files of %d bytes, 4 readers, page cache dropped, medians of %d runs (UCX_TLS=%s%s, B read %ss after its mount)\n' \
  "$FILES" "$SIZE" "$RUNS" "$UCX_TLS" "${CACHE_FS:+, the caches of A and B on a journaled $CACHE_FS loop image}" "${SETTLE:-2}"
printf '  local copy, direct           %8.0f files/s   runs: %s\n' "$(median < "$W/local.txt")" "$(runs "$W/local.txt")"
for i in "${!BINS[@]}"; do
  [ "${#BINS[@]}" -gt 1 ] && echo "  B$i = ${BINS[$i]}"
done
for k in "${KEYS[@]}"; do
  what=$(printf '%-28s' "${LABEL[$k]}")
  printf '  %s   %8.0f files/s   runs: %s\n' "$what" "$(median < "$W/$k.txt")" "$(runs "$W/$k.txt")"
  if [ "${k#fill-}" != "$k" ]; then
    printf '    daemon CPU per file: %.0f us   (runs: %s); context switches per file: %.1f\n' \
      "$(median < "$W/$k.cpu_b.txt")" "$(runs "$W/$k.cpu_b.txt")" "$(median < "$W/$k.sw_b.txt")"
    continue
  fi
  printf '    daemon CPU per file: puller B %.0f us, holder A %.0f us   (runs B: %s)\n' \
    "$(median < "$W/$k.cpu_b.txt")" "$(median < "$W/$k.cpu_a.txt")" "$(runs "$W/$k.cpu_b.txt")"
  if [ "$k" = floor-fuse ]; then
    printf '    context switches per file: %.1f\n' "$(median < "$W/$k.sw_b.txt")"
    continue
  fi
  printf '    context switches per file: puller B %.1f, holder A %.1f\n' \
    "$(median < "$W/$k.sw_b.txt")" "$(median < "$W/$k.sw_a.txt")"
done
# FLOOR=1: each pulled configuration against issue 49's targets, from the medians above (the
# two daemons' medians added): pull / the floor's "a new file each" (target 1.5), the same with
# the FUSE floor taken out of the pull (the kernel's requests, which the floor does not make),
# and a hit against 50 us and the FUSE floor.
if [ "${FLOOR:-0}" = 1 ]; then
  nf=
  for k in "${KEYS[@]}"; do [ "${LABEL[$k]}" != "floor: disk, sealed, a new file each" ] || nf=$k; done
  [ -n "$nf" ] || { echo "no floor row \"a new file each\"" >&2; exit 1; }
  floor=$(( $(median < "$W/$nf.cpu_a.txt" | cut -d. -f1) + $(median < "$W/$nf.cpu_b.txt" | cut -d. -f1) ))
  fuse=$(median < "$W/floor-fuse.cpu_b.txt" | cut -d. -f1)
  echo "against issue 49's targets (us of daemon CPU per file; floor $floor, FUSE floor $fuse):"
  for k in "${KEYS[@]}"; do
    [ "${k#dyadfs-}" != "$k" ] && [ "${k%-hit}" = "$k" ] || continue
    pull=$(( $(median < "$W/$k.cpu_a.txt" | cut -d. -f1) + $(median < "$W/$k.cpu_b.txt" | cut -d. -f1) ))
    awk -v l="${LABEL[$k]}" -v p="$pull" -v f="$floor" -v u="$fuse" 'BEGIN {
      printf "  %s: pull %d, %.2fx the floor (target 1.5), %.2fx without the FUSE floor\n",
        l, p, p / f, (p - u) / f }'
    [ -f "$W/$k-hit.cpu_b.txt" ] || continue
    awk -v h="$(median < "$W/$k-hit.cpu_b.txt")" -v u="$fuse" 'BEGIN {
      printf "    a hit %.0f (target 50), %.2fx the FUSE floor\n", h, h / u }'
  done
fi
