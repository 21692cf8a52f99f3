#!/usr/bin/env bash
# Pong on the current code: the main job (`make train`'s defaults) for 10M frames over seeds, one run at a time
# at nice 19, then asyncrl-compare (IQM and interval, frames to +18 and +20) over the seeds (docs/results.md).
#
#   scripts/pong_seeds.sh [OUT] [SEEDS...]    # default runs/pong_seeds, seeds 0 1 2
#
# nice 19 yields only to processes of its own autogroup (one per session): to leave the CPU to other sessions'
# work, start it in a session of its own; the script then lowers that session's autogroup itself (an
# `echo 19 > /proc/$!/autogroup` from the caller can run before setsid and lower the caller's group instead):
#   setsid scripts/pong_seeds.sh runs/pong_seeds > pong_seeds.log 2>&1 &
# A seed whose run directory has stopped.json is skipped: delete a stopped partial run to train that seed again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
OUT="${1:-runs/pong_seeds}"
shift || true
SEEDS=("${@:-0 1 2}")
mkdir -p "$OUT"
# the autogroup of this session (setsid above), when the kernel has autogroups
[ "$(ps -o sid= -p $$ | tr -d " ")" = "$$" ] && echo 19 > /proc/self/autogroup 2>/dev/null || true
for seed in ${SEEDS[*]}; do
    [ -f "$OUT/seed$seed/stopped.json" ] && continue
    nice -n 19 "$BIN/asyncrl-train" --env atari_pong --frames 10000000 --seed "$seed" \
        --train-dir "$OUT" --experiment "seed$seed" > "$OUT/seed$seed.log" 2>&1
done
"$BIN/asyncrl-compare" "$OUT" --threshold 18
"$BIN/asyncrl-compare" "$OUT" --threshold 20
