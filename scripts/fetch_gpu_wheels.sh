#!/usr/bin/env bash
# Fetch, on a machine that reaches PyPI, the wheels scripts/gpu_check.sh installs on a GPU machine that does not.
#
#   scripts/fetch_gpu_wheels.sh [DIR] [--python-version 3.12] [--all]
#
# DIR (default shared/wheels, which git ignores) receives binary wheels for the GPU machine's Python
# (--python-version, default 3.12) on x86-64 Linux. torch is never fetched: the check uses the GPU machine's own
# CUDA build. By default only what a stock PyTorch image lacks is fetched (gymnasium and its
# farama-notifications, faster-fifo, ale-py, setproctitle); --all adds every other runtime dependency of asyncrl
# (numpy, psutil, tensorboard, matplotlib, imageio, pyyaml, ... and their own dependencies) for a bare Python.
# Versions are those of this checkout's .venv where it has them, so the GPU check runs what the tests ran.
# Then copy DIR to the GPU machine (or let it travel inside the checkout) and run
#   scripts/gpu_check.sh --wheels DIR
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/shared/wheels"
PYVER="3.12"
ALL=0
while [ $# -gt 0 ]; do
    case "$1" in
        --python-version) PYVER="$2"; shift 2 ;;
        --all) ALL=1; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        -*) echo "fetch_gpu_wheels.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) DEST="$1"; shift ;;
    esac
done
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || PY="$(command -v python3)"

MISSING=(gymnasium farama-notifications faster-fifo ale-py setproctitle)
REST=(numpy psutil tensorboard tensorboard-data-server matplotlib contourpy cycler fonttools kiwisolver pillow
      pyparsing python-dateutil six packaging imageio pyyaml cloudpickle typing-extensions protobuf grpcio
      markdown werkzeug markupsafe absl-py
      ray click filelock jsonschema jsonschema-specifications referencing rpds-py attrs msgpack requests idna
      urllib3 certifi charset-normalizer)  # ray and its dependencies: gpu_check.sh's remote-actors row
NAMES=("${MISSING[@]}")
[ "$ALL" = 1 ] && NAMES+=("${REST[@]}")

# NAME==VERSION where this checkout's venv has NAME, else NAME (pip picks the newest wheel for PYVER).
mapfile -t SPECS < <("$PY" - "${NAMES[@]}" <<'EOF'
import sys
from importlib import metadata
for name in sys.argv[1:]:
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(name)
EOF
)

mkdir -p "$DEST"
PLATFORMS=()
for p in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
         manylinux_2_17 manylinux2014 manylinux1; do
    PLATFORMS+=(--platform "${p}_x86_64")
done
for spec in "${SPECS[@]}"; do  # one at a time: --no-deps, and a missing wheel names its package
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        "${PLATFORMS[@]}" --platform any -d "$DEST" "$spec" \
        || { echo "fetch_gpu_wheels.sh: no wheel of $spec for Python $PYVER on x86-64 Linux" >&2; exit 1; }
done
echo "fetch_gpu_wheels.sh: $(ls "$DEST"/*.whl | wc -l) wheels in $DEST ($(du -sh "$DEST" | cut -f1)) for Python $PYVER"
