#!/usr/bin/env bash
# Builds the Python wheel (pyproject.toml: the dyadfs binary and the dyadfs package) into
# target/wheels with maturin from the project's venv, linked by zig against glibc 2.28 so that
# it installs on manylinux_2_28 systems (RHEL 8 and later, Debian 10+, Ubuntu 18.10+); auditwheel
# show's verdict goes to target/wheels/auditwheel.txt. The binary looks for UCX only where it is
# installed (UCX_SYS_PORTABLE=1: never in this machine's .tools). bindgen runs clang for the host
# (the UCX headers' types are the same on every x86_64 glibc), so it is given the host's headers.
# Usage: scripts/build-wheel.sh          (after scripts/install-deps.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(cd "${DYADFS_VENV:-.venv}" && pwd)
clang_include=$(dirname "$(ls /usr/lib/llvm-*/lib/clang/*/include/stddef.h | sort -V | tail -1)")
rm -f target/wheels/dyadfs-*.whl
BINDGEN_EXTRA_CLANG_ARGS="-I$clang_include -I/usr/include/$(uname -m)-linux-gnu -I/usr/include" \
  UCX_SYS_PORTABLE=1 PATH="$VENV/bin:$PATH" \
  "$VENV/bin/maturin" build --release --zig --compatibility manylinux_2_28 --out target/wheels
"$VENV/bin/auditwheel" show target/wheels/dyadfs-*.whl > target/wheels/auditwheel.txt
head -2 target/wheels/auditwheel.txt
