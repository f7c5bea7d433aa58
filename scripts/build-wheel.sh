#!/usr/bin/env bash
# Builds the Python wheel (pyproject.toml: the dyadfs binary and the dyadfs package) into
# target/wheels with maturin from the project's venv, for `pip install` anywhere with glibc as
# new as this machine's (auditwheel show names the manylinux tag). The binary looks for UCX only
# where it is installed (UCX_SYS_PORTABLE=1: not in this machine's .tools). Usage:
#   scripts/build-wheel.sh          (after scripts/install-deps.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DYADFS_VENV:-.venv}
rm -f target/wheels/dyadfs-*.whl
UCX_SYS_PORTABLE=1 "$VENV/bin/maturin" build --release --out target/wheels
"$VENV/bin/auditwheel" show target/wheels/dyadfs-*.whl > target/wheels/auditwheel.txt
head -2 target/wheels/auditwheel.txt
