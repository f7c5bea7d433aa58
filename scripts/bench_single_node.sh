#!/usr/bin/env bash
# Single-node read benchmark, side by side in one run (medians of RUNS runs):
#   (a) a cached 1 GiB file read sequentially (dd bs=1M)
#   (b) 4096 cached files of 128 KiB read in random order by 4 processes
# each through dyadfs (passthrough, passthrough with --read-only, --no-passthrough, --no-open),
# directly on the same disk, and through
# bindfs -o kernel_cache over the same tree; "cold" drops the page cache before each run,
# "warm" does not. Needs root. Usage: scripts/bench_single_node.sh [WORKDIR]  (env: RUNS, BASE_BIN,
# BASE_ARGS)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
RUNS=${RUNS:-5}
scripts/install-deps.sh
dpkg -s bindfs >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bindfs >/dev/null
cargo build --release --quiet
BIN=$PWD/target/release/dyadfs
W=${1:-$(mktemp -d /var/tmp/dyadfs-bench.XXXX)}
mkdir -p "$W"/{backing/small,ssd,mnt,bind}
cleanup() {
  unmount_mounted "$W/mnt" "$W/mnt2" "$W/mnt3" "$W/mnt4" "$W/mnt5" "$W/bind"
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT

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
# an A/B in the same run.
declare -A R
CONFIGS=(direct dyadfs-passthrough dyadfs-read-only dyadfs-no-passthrough dyadfs-no-open
  bindfs-kernel_cache)
declare -A DIR=([direct]="$W/backing" [dyadfs-passthrough]="$W/mnt" [dyadfs-no-passthrough]="$W/mnt2"
  [bindfs-kernel_cache]="$W/bind" [base]="$W/mnt3" [dyadfs-read-only]="$W/mnt4"
  [dyadfs-no-open]="$W/mnt5")
mkdir -p "$W"/{mnt2,mnt3,mnt4,mnt5,ssd2,ssd3,ssd4,ssd5}
rm -rf "$W"/ssd/* "$W"/ssd2/* "$W"/ssd3/* "$W"/ssd4/* "$W"/ssd5/*
"$BIN" mount "$W/mnt" --ssd "$W/ssd" --backing "$W/backing"
"$BIN" mount "$W/mnt2" --ssd "$W/ssd2" --backing "$W/backing" --no-passthrough
"$BIN" mount "$W/mnt4" --ssd "$W/ssd4" --backing "$W/backing" --read-only
"$BIN" mount "$W/mnt5" --ssd "$W/ssd5" --backing "$W/backing" --no-open
if [ -n "${BASE_BIN:-}" ]; then
  # shellcheck disable=SC2086 # BASE_ARGS is a list of options, split into words
  "$BASE_BIN" mount "$W/mnt3" --ssd "$W/ssd3" --backing "$W/backing" ${BASE_ARGS:-}
  CONFIGS+=(base)
fi
bindfs -o kernel_cache "$W/backing" "$W/bind"
for c in "${CONFIGS[@]}"; do big "${DIR[$c]}"; small "${DIR[$c]}"; done   # fill the caches
for temp in cold warm; do
  for w in big small; do
    for r in $(seq "$RUNS"); do
      for c in "${CONFIGS[@]}"; do
        [ "$temp" = cold ] && drop
        [ "$temp" = warm ] && $w "${DIR[$c]}"   # this config's own pages in the page cache
        t0=$(now); $w "${DIR[$c]}"; t=$(echo "$(now) - $t0" | bc -l)
        echo "$t" >> "$W/t.$c.$w.$temp"
        printf '%s %s %s run %d: %.3f s\n' "$c" "$w" "$temp" "$r" "$t" >&2
      done
    done
    for c in "${CONFIGS[@]}"; do R[$c,$w,$temp]=$(median < "$W/t.$c.$w.$temp"); done
  done
done
"$BIN" stats "$W/mnt" --json > "$W/stats-passthrough.json"
"$BIN" stats "$W/mnt2" --json > "$W/stats-no-passthrough.json"

printf '\n%-24s %14s %14s %16s %16s\n' config "1GiB cold MB/s" "1GiB warm MB/s" "small cold f/s" "small warm f/s"
for c in "${CONFIGS[@]}"; do
  printf '%-24s' $c
  for k in big,cold big,warm; do printf ' %14.0f' "$(echo "1073.741824 / ${R[$c,$k]}" | bc -l)"; done
  for k in small,cold small,warm; do printf ' %16.0f' "$(echo "4096 / ${R[$c,$k]}" | bc -l)"; done
  echo
done
printf '\nratio to direct (higher is better, 1.00 = as fast as the disk):\n'
for c in "${CONFIGS[@]:1}"; do
  printf '%-24s' $c
  for k in big,cold big,warm small,cold small,warm; do printf ' %8.2f' "$(echo "${R[direct,$k]} / ${R[$c,$k]}" | bc -l)"; done
  echo
done
echo "(columns: 1GiB cold, 1GiB warm, small cold, small warm; medians of $RUNS interleaved runs)"
