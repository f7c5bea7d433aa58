#!/usr/bin/env bash
# Single-node read benchmark, side by side in one run (medians of RUNS runs):
#   (a) a cached 1 GiB file read sequentially (dd bs=1M)
#   (b) 4096 cached files of 128 KiB read in random order by 4 processes ("small": `cat`s
#       started by xargs; "loop": 4 Python processes each reading its quarter, as a training
#       loop's workers do)
# each through dyadfs (the default mode, "passthrough": every cached file passed through where
# the kernel offers passthrough (--pack-max auto); --read-only; --no-passthrough (small files
# then packed into segments and served by the daemon with their pages kept); --no-open;
# "packed": --pack-max 1M, small files packed though the kernel could be handed them; each with
# FUSE requests by /dev/fuse, and the default, --read-only and packed again with them by the
# kernel's io_uring queues, "-uring"), directly on the same disk, and through
# bindfs -o kernel_cache over the same tree; "cold" drops the page cache before each run,
# "warm" does not. Then the daemons' CPU per small file read (all runs), and a FUSE round trip:
# stat of one file on mounts that never cache attributes (--metadata-ttl 0), by each transport.
# The ring needs /sys/module/fuse/parameters/enable_uring set: the script sets it and puts it
# back. Needs root. Usage: scripts/bench_single_node.sh [WORKDIR]  (env: RUNS, DYADFS_BIN (a
# build to measure instead of this tree's), BASE_BIN, BASE_ARGS, ONLY="config ..." to run some
# configurations only)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-5}
URING=/sys/module/fuse/parameters/enable_uring
was_uring=$(cat "$URING" 2>/dev/null || true)
build_dyadfs
dpkg -s bindfs >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bindfs >/dev/null
W=${1:-$(mktemp -d /var/tmp/dyadfs-bench.XXXX)}
mkdir -p "$W"/{backing/small,ssd,mnt,bind}
cleanup() {
  unmount_mounted "$W/mnt" "$W/mnt2" "$W/mnt3" "$W/mnt4" "$W/mnt5" "$W/mnt6" "$W/mnt7" \
    "$W/mnt8" "$W/mnt9" \
    "$W/rt-dev" "$W/rt-uring" "$W/bind"
  [ -z "$was_uring" ] || echo "$was_uring" > "$URING"
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
# Set once the trap that puts it back is in place.
[ -z "$was_uring" ] || echo Y > "$URING"

echo "generating data in $W/backing" >&2
[ -f "$W/backing/big.bin" ] || head -c 1G /dev/urandom > "$W/backing/big.bin"
if [ ! -f "$W/backing/small/4095.bin" ]; then
  python3 - "$W/backing/small" <<'PY'
import os, sys
for i in range(4096):
    open(os.path.join(sys.argv[1], f"{i}.bin"), "wb").write(os.urandom(128 << 10))
PY
fi
ls "$W/backing/small" | shuf --random-source=<(yes) > "$W/order"

big() { dd if="$1/big.bin" of=/dev/null bs=1M 2>/dev/null; }
small() { (cd "$1/small" && xargs -P4 -n 64 cat < "$W/order" > /dev/null); }
# A training loop's reads: 4 Python processes, each its quarter of the shuffled files whole
# (scripts/lib/readers.py).
loop() { python3 scripts/lib/readers.py "$1/small" "$W/order" > "$W/loop.t"; }
# median of RUNS timings of "$@" (cold: drop caches first)
measure() {
  local temp=$1; shift
  local ts=()
  for _ in $(seq "$RUNS"); do
    [ "$temp" = cold ] && drop
    local t0; t0=$(now); "$@"; ts+=("$(echo "$(now) - $t0" | bc -l)")
  done
  printf '%s\n' "${ts[@]}" | median
}
command -v bc >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bc >/dev/null

# Every configuration is mounted at once and they take turns run by run (interleaved), so a
# slow moment of the VM hits all of them. BASE_BIN=path adds "base": another dyadfs binary (e.g.
# the previous commit's) in passthrough mode, or mounted with BASE_ARGS (e.g. "--no-open"), for
# an A/B in the same run. Its transport is the default (auto: the ring, which this script
# enables): against dyadfs-passthrough (/dev/fuse) give BASE_ARGS="--fuse-transport dev".
declare -A R
CONFIGS=(direct dyadfs-passthrough dyadfs-read-only dyadfs-no-passthrough dyadfs-no-open
  dyadfs-packed dyadfs-passthrough-uring dyadfs-read-only-uring dyadfs-packed-uring
  bindfs-kernel_cache)
if [ -n "${ONLY:-}" ]; then read -r -a CONFIGS <<< "direct ${ONLY/direct/}"; fi
declare -A DIR=([direct]="$W/backing" [dyadfs-passthrough]="$W/mnt" [dyadfs-no-passthrough]="$W/mnt2"
  [bindfs-kernel_cache]="$W/bind" [base]="$W/mnt3" [dyadfs-read-only]="$W/mnt4"
  [dyadfs-no-open]="$W/mnt5" [dyadfs-passthrough-uring]="$W/mnt6"
  [dyadfs-read-only-uring]="$W/mnt7" [dyadfs-packed]="$W/mnt8" [dyadfs-packed-uring]="$W/mnt9")
declare -A OPTS=([dyadfs-passthrough]="" [dyadfs-no-passthrough]="--no-passthrough"
  [dyadfs-read-only]="--read-only" [dyadfs-no-open]="--no-open"
  [dyadfs-passthrough-uring]="" [dyadfs-read-only-uring]="--read-only"
  [dyadfs-packed]="--pack-max 1M" [dyadfs-packed-uring]="--pack-max 1M")
mkdir -p "$W"/{mnt2,mnt3,mnt4,mnt5,mnt6,mnt7,mnt8,mnt9,ssd2,ssd3,ssd4,ssd5,ssd6,ssd7,ssd8,ssd9} \
  "$W"/{rt-dev,rt-uring,rt-ssd-dev,rt-ssd-uring}
rm -rf "$W"/ssd/* "$W"/ssd[2-9]/* "$W"/rt-ssd-*/*
for c in "${CONFIGS[@]}"; do
  case $c in
    *-uring) transport=uring ;;
    dyadfs-*) transport=dev ;;
    *) continue ;;
  esac
  m=${DIR[$c]}; ssd=$W/ssd${m#"$W"/mnt}
  # shellcheck disable=SC2086 # OPTS holds a list of options, split into words
  "$BIN" mount "$m" --ssd "$ssd" --backing "$W/backing" --fuse-transport $transport ${OPTS[$c]}
done
if [ -n "${BASE_BIN:-}" ]; then
  # shellcheck disable=SC2086 # BASE_ARGS is a list of options, split into words
  "$BASE_BIN" mount "$W/mnt3" --ssd "$W/ssd3" --backing "$W/backing" ${BASE_ARGS:-}
  CONFIGS+=(base)
fi
[[ " ${CONFIGS[*]} " != *" bindfs-kernel_cache "* ]] || bindfs -o kernel_cache "$W/backing" "$W/bind"
for c in "${CONFIGS[@]}"; do big "${DIR[$c]}"; small "${DIR[$c]}"; done   # fill the caches
# A daemon's CPU time so far (user + system, in clock ticks).
cpu_ticks() {
  # By its mount point: the binary may have another name (DYADFS_BIN, BASE_BIN).
  local pid; pid=$(pgrep -f -- " mount $1 " | head -1)
  [ -n "$pid" ] && awk '{print $14 + $15}' "/proc/$pid/stat" || echo 0
}
declare -A CPU   # the daemons' CPU ticks in the timed small-file runs, by config and temperature
for temp in cold warm; do
  for w in big small loop; do
    for r in $(seq "$RUNS"); do
      # Each run starts one configuration later, so that none always holds one place: the
      # place mattered (the last of three was up to 10% faster in small-file rates).
      for i in "${!CONFIGS[@]}"; do
        c=${CONFIGS[$(((i + r - 1) % ${#CONFIGS[@]}))]}
        [ "$temp" = cold ] && drop
        [ "$temp" = warm ] && $w "${DIR[$c]}"   # this config's own pages in the page cache
        c0=$(cpu_ticks "${DIR[$c]}")
        t0=$(now); $w "${DIR[$c]}"; t=$(echo "$(now) - $t0" | bc -l)
        [ "$w" = loop ] && t=$(cat "$W/loop.t")
        [ "$w" = small ] && CPU[$c,$temp]=$(( ${CPU[$c,$temp]:-0} + $(cpu_ticks "${DIR[$c]}") - c0 ))
        echo "$t" >> "$W/t.$c.$w.$temp"
        printf '%s %s %s run %d: %.3f s\n' "$c" "$w" "$temp" "$r" "$t" >&2
      done
    done
    for c in "${CONFIGS[@]}"; do R[$c,$w,$temp]=$(median < "$W/t.$c.$w.$temp"); done
  done
done
for c in "${CONFIGS[@]}"; do
  [[ $c == dyadfs-* ]] && "$BIN" stats "${DIR[$c]}" --json > "$W/stats-$c.json"
done

# The FUSE round trip: stat of one file, attributes never cached, by each transport (20000
# stats a run, interleaved).
"$BIN" mount "$W/rt-dev" --ssd "$W/rt-ssd-dev" --backing "$W/backing" --metadata-ttl 0s --fuse-transport dev
"$BIN" mount "$W/rt-uring" --ssd "$W/rt-ssd-uring" --backing "$W/backing" --metadata-ttl 0s --fuse-transport uring
stat_loop() { python3 -c 'import os,sys,time
p=sys.argv[1]; t=time.perf_counter()
for _ in range(20000): os.stat(p)
print((time.perf_counter()-t)/20000*1e6)' "$1/small/0.bin"; }
for r in $(seq "$RUNS"); do
  for t in dev uring; do
    us=$(stat_loop "$W/rt-$t"); echo "$us" >> "$W/rt.$t"
    printf 'stat round trip %s run %d: %.2f us\n' "$t" "$r" "$us" >&2
  done
done

printf '\n%-24s %14s %14s %16s %16s %16s %16s\n' config "1GiB cold MB/s" "1GiB warm MB/s" \
  "small cold f/s" "small warm f/s" "loop cold f/s" "loop warm f/s"
for c in "${CONFIGS[@]}"; do
  printf '%-24s' $c
  for k in big,cold big,warm; do printf ' %14.0f' "$(echo "1073.741824 / ${R[$c,$k]}" | bc -l)"; done
  for k in small,cold small,warm loop,cold loop,warm; do
    printf ' %16.0f' "$(echo "4096 / ${R[$c,$k]}" | bc -l)"
  done
  echo
done
printf '\nratio to direct (higher is better, 1.00 = as fast as the disk):\n'
for c in "${CONFIGS[@]:1}"; do
  printf '%-24s' $c
  for k in big,cold big,warm small,cold small,warm loop,cold loop,warm; do
    printf ' %8.2f' "$(echo "${R[direct,$k]} / ${R[$c,$k]}" | bc -l)"
  done
  echo
done
echo "(columns: 1GiB cold, 1GiB warm, small cold, small warm, loop cold, loop warm; medians of $RUNS interleaved runs)"
printf '\ndaemon CPU per small file read (the %d timed small runs of each; warm: every request of an\nopen-read-close whose bytes the kernel keeps):\n' "$RUNS"
printf '%-24s %10s %10s\n' config cold warm
hz=$(getconf CLK_TCK)
for c in "${CONFIGS[@]}"; do
  [[ $c == dyadfs-* || $c == base ]] || continue
  printf '%-24s' "$c"
  for temp in cold warm; do
    printf ' %7.1f us' "$(echo "${CPU[$c,$temp]} / $hz * 1000000 / (4096 * $RUNS)" | bc -l)"
  done
  echo
done
printf '\nFUSE round trip (stat, attributes uncached), median of %d runs of 20000:\n' "$RUNS"
for t in dev uring; do printf '%-8s %8.2f us\n' "$t" "$(median < "$W/rt.$t")"; done
