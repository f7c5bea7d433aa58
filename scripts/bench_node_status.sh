#!/usr/bin/env bash
# What a `dyadfs node status` poll (a monitor, a Prometheus scrape) costs the node's readers: on
# the cache a `KEEP=1 scripts/bench_node_restart.sh WORKDIR` run left (its N files), the service
# serves a mount; a probe opens 2,000 of the sample's files over and over for PROBE_SECONDS, alone
# and while `node status` runs in a loop, builds interleaved run by run; each run prints the
# probe's opens and their latency (median, p99, p99.9, max).
# Usage: scripts/bench_node_status.sh WORKDIR   Env: BINS ("A B": dyadfs builds; default this
# tree's release build), RUNS (3), PROBE_SECONDS (10).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/common.sh
W=${1:?the WORKDIR of a KEEP=1 bench_node_restart.sh run}
RUNS=${RUNS:-3} PROBE_SECONDS=${PROBE_SECONDS:-10}
build_dyadfs
read -ra builds <<< "${BINS:-$BIN}"
PROBE=$PWD/scripts/lib/open_probe.py
service=
loop=
stop_all() {
  set +e
  [ -z "$loop" ] || { kill "$loop"; wait "$loop"; } 2> /dev/null
  unmount_mounted "$W/mnt"
  [ -z "$service" ] || { kill "$service"; wait "$service"; } 2> /dev/null
}
trap stop_all EXIT
for run in $(seq "$RUNS"); do
  for BIN in "${builds[@]}"; do
    for polled in 0 1; do
      node_serve --capacity "$(($(du -sb "$W/node" | cut -f1) * 2))"
      node_mount
      (cd "$W/mnt" && head -2000 "$W/sample" | xargs cat > /dev/null)
      if [ "$polled" = 1 ]; then
        (while :; do "$BIN" node status --socket "$W/node.sock" > /dev/null 2>&1; done) &
        loop=$!
      fi
      r=$(/usr/bin/python3 "$PROBE" "$W/mnt" "$W/sample" "$PROBE_SECONDS")
      if [ -n "$loop" ]; then kill "$loop"; wait "$loop" 2> /dev/null || true; loop=; fi
      echo "run $run, $BIN, status polled $polled: $r"
      fusermount3 -u "$W/mnt"
      node_stop
    done
  done
done
