#!/usr/bin/env bash
# Installs the system packages dyadfs builds, tests and benchmarks with (Debian 12).
# Idempotent; needs root (or sudo). The Rust toolchain itself is expected to be present.
# Usage: scripts/install-deps.sh [--no-torch]
set -euo pipefail
# fuse3: fusermount3; libclang-dev: bindgen for ucx-sys; libnuma1: UCX's shared-memory transports;
# bc: the benchmark scripts' arithmetic; rsync: a producer tool the managed-directory tests run;
# python3-venv, gcc: the examples the tests run (C programs, and tests/attack/ucx_attack.c;
# Python with numpy and torch); util-linux, e2fsprogs:
# the loop-mounted ext4 and setpriv of the cache-disk and local-user tests, the demo's slow
# shared FS. UCX itself comes from PyPI, below.
PKGS=(fuse3 pkg-config python3 python3-venv gcc util-linux e2fsprogs libnuma1 libclang-dev bc rsync)
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
# wheel, about 5 GB with the CUDA libraries it pulls; it runs on CPU), and maturin and auditwheel
# and ziglang that build, check and link the wheel (scripts/build-wheel.sh). DYADFS_VENV moves it.
# --no-torch: numpy only, for loops that do not run the examples' and workload tests (about
# 5 GB and minutes less).
VENV=${DYADFS_VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv}
PY_PKGS=(numpy torch maturin auditwheel ziglang)
[ "${1:-}" = --no-torch ] && PY_PKGS=(numpy maturin auditwheel ziglang)
if ! "$VENV/bin/python3" -c "import $(IFS=,; echo "${PY_PKGS[*]}")" >/dev/null 2>&1; then
  echo "installing ${PY_PKGS[*]} into $VENV (a few minutes with torch)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PY_PKGS[@]}"
fi

# UCX >= 1.14, into .tools/ucx (DYADFS_TOOLS moves it), where ucx-sys finds it before any system
# UCX. Debian 12 ships 1.13.1, whose wireup aborts the process (ucp_request.c:684 "got REP
# message") when a peer restarts quickly, so a restarting node could kill its neighbours' daemons;
# the fix (openucx/ucx#8175) is in every later release. The build is RAPIDS' `libucx-cu12` wheel
# (UCX's own release build with headers, pkg-config files and ucx_perftest), pinned by version and
# sha256 (the examples' venv's pip fetches it); its CUDA modules are removed (dyadfs moves host
# memory; they would only probe for a GPU).
TOOLS=${DYADFS_TOOLS:-$(cd "$(dirname "$0")/.." && pwd)/.tools}
UCX_VERSION=1.22.0
UCX_WHEEL=libucx_cu12-$UCX_VERSION-py3-none-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
UCX_SHA256=5cbbef0c140a0a158ae3486089af659b38822b2234cd3dc90ba40a5e6553402a
UCX_HOME=$TOOLS/ucx/libucx
if [ "$(cat "$TOOLS/ucx/VERSION" 2>/dev/null)" != "$UCX_VERSION" ]; then
  echo "installing UCX $UCX_VERSION into $TOOLS/ucx" >&2
  tmp=$(mktemp -d)
  "$VENV/bin/python3" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
    --dest "$tmp" "libucx-cu12==$UCX_VERSION"
  echo "$UCX_SHA256  $tmp/$UCX_WHEEL" | sha256sum --check --quiet
  rm -rf "$TOOLS/ucx"
  mkdir -p "$TOOLS"
  python3 -m zipfile -e "$tmp/$UCX_WHEEL" "$TOOLS/ucx"
  rm -rf "$tmp" "$TOOLS/ucx"/libucx_cu12-*.dist-info
  rm -f "$UCX_HOME"/lib/ucx/*cuda* "$TOOLS/ucx"/libucx_cu12.libs/libcudart*
  chmod +x "$UCX_HOME"/bin/*
  # The wheel's pkg-config files name the directory it was built in.
  sed -i "s|^prefix = .*|prefix = $UCX_HOME|" "$UCX_HOME"/lib/pkgconfig/*.pc
  echo "$UCX_VERSION" > "$TOOLS/ucx/VERSION"
fi
# UCX's memory hooks off: at library load they patch mmap and its kin, waiting out a grace
# period per function, which made every start of a dyadfs binary take 0.4 s (0.35 s of CPU) on
# the 2-vCPU VM. They serve UCX's registration cache, which dyadfs does not use (its slab is
# registered once and every get names the registration). UCX reads this file beside its
# libraries; a variable in the environment still wins (common.sh turns the hooks back on for
# ucx_perftest, the benchmarks' baseline).
UCX_CONF=$UCX_HOME/etc/ucx/ucx.conf
if ! grep -qx 'UCX_MEM_MMAP_HOOK_MODE=none' "$UCX_CONF" 2>/dev/null; then
  mkdir -p "$(dirname "$UCX_CONF")"
  { echo 'UCX_MEM_MMAP_HOOK_MODE=none'; cat "$UCX_CONF" 2>/dev/null || true; } > "$UCX_CONF.new"
  mv "$UCX_CONF.new" "$UCX_CONF"
fi

# pjdfstest, the public POSIX file-system suite tests/posix.rs runs in a mount (a pinned
# release, built once into .tools/).
if [ ! -x "$TOOLS/bin/pjdfstest" ]; then
  echo "building pjdfstest 0.2.2 into $TOOLS (about a minute)" >&2
  cargo install -q --locked --version 0.2.2 --root "$TOOLS" pjdfstest
fi
