#!/usr/bin/env bash
# Soak test: train Pong for MINUTES, sample every process's memory every ~10 s, report growth after warm-up.
# Usage: scripts/soak.sh MINUTES [asyncrl-train flags...]     e.g. scripts/soak.sh 30 --workers 8
# Exit code 1 if the total PSS grew more than 5% after the warm-up (see scripts/soak.py for the details).
set -euo pipefail
if [[ $# -lt 1 || ! $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; then
    echo "usage: $0 MINUTES [asyncrl-train flags...]" >&2
    exit 2
fi
minutes=$1
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
exec "$python" "$root/scripts/soak.py" --minutes "$minutes" -- "$@"
