#!/usr/bin/env bash
# Runs a command in a private mount namespace where VIEW shows this rank's node: rank i (from
# OMPI_COMM_WORLD_RANK, else RANK, else 0) gets the i-th of SOURCES bind-mounted on VIEW. So
# every rank reads the same path, as on a real cluster, through its own node's mount.
# Usage: in_view.sh "SRC0 SRC1 ..." VIEW COMMAND [ARGS...]
set -euo pipefail
read -r -a sources <<< "$1"
rank=${OMPI_COMM_WORLD_RANK:-${RANK:-0}}
src=${sources[$((rank % ${#sources[@]}))]}
view=$2
shift 2
exec unshare -m --propagation private -- sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' \
  in_view "$src" "$view" "$@"
