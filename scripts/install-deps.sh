#!/usr/bin/env bash
# Installs the system packages dyadfs builds, tests and benchmarks with (Debian 12).
# Idempotent; needs root (or sudo). The Rust toolchain itself is expected to be present.
set -euo pipefail
# fuse3: fusermount3; libucx-dev: UCX (linked via pkg-config); libclang-dev: bindgen for ucx-sys;
# ucx-utils: ucx_perftest for the benchmark; bc: the benchmark scripts' arithmetic;
# python3-venv, gcc: the examples the tests run (C programs; Python with numpy and torch).
PKGS=(fuse3 pkg-config python3 python3-venv gcc util-linux libucx-dev ucx-utils libclang-dev bc)
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

# The Python environment of the examples and workload tests: numpy and torch (the default PyPI
# wheel, about 5 GB with the CUDA libraries it pulls; it runs on CPU). DYADFS_VENV moves it.
VENV=${DYADFS_VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv}
if ! "$VENV/bin/python3" -c 'import numpy, torch' >/dev/null 2>&1; then
  echo "installing numpy and torch into $VENV (a few minutes)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check numpy torch
fi

# pjdfstest, the public POSIX file-system suite tests/posix.rs runs in a mount (a pinned
# release, built once into .tools/; DYADFS_TOOLS moves it).
TOOLS=${DYADFS_TOOLS:-$(cd "$(dirname "$0")/.." && pwd)/.tools}
if [ ! -x "$TOOLS/bin/pjdfstest" ]; then
  echo "building pjdfstest 0.2.2 into $TOOLS (about a minute)" >&2
  cargo install -q --locked --version 0.2.2 --root "$TOOLS" pjdfstest
fi
