#!/usr/bin/env bash
# Installs the system packages dyadfs builds, tests and benchmarks with (Debian 12).
# Idempotent; needs root (or sudo). The Rust toolchain itself is expected to be present.
set -euo pipefail
# fuse3: fusermount3; libucx-dev: UCX (linked via pkg-config); libclang-dev: bindgen for ucx-sys;
# ucx-utils: ucx_perftest for the benchmark; bc: the benchmark scripts' arithmetic.
PKGS=(fuse3 pkg-config python3 util-linux libucx-dev ucx-utils libclang-dev bc)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "installing: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
