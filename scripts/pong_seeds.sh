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
# A seed whose run stopped at 10M frames is skipped; one with checkpoints short of that (stopped by Ctrl-C, a
# reboot, an earlier shorter budget) is continued with --resume; delete a run directory to train that seed afresh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
OUT="${1:-runs/pong_seeds}"
shift || true
SEEDS=("${@:-0 1 2}")
mkdir -p "$OUT"
# the autogroup of this session (setsid above), when the kernel has autogroups
[ "$(ps -o sid= -p $$ | tr -d " ")" = "$$" ] && echo 19 > /proc/self/autogroup 2>/dev/null || true
FRAMES=10000000
for seed in ${SEEDS[*]}; do
    run="$OUT/seed$seed"
    done_frames=$("$BIN/python" -c 'import json, sys
try:
    print(json.load(open(sys.argv[1])).get("frames", 0))
except (OSError, ValueError):
    print(0)' "$run/stopped.json")
    [ "$done_frames" -ge "$FRAMES" ] && continue
    resume=()
    compgen -G "$run/checkpoints/ckpt_*.pt" > /dev/null && resume=(--resume)
    nice -n 19 "$BIN/asyncrl-train" --env atari_pong --frames "$FRAMES" --seed "$seed" "${resume[@]}" \
        --train-dir "$OUT" --experiment "seed$seed" >> "$OUT/seed$seed.log" 2>&1
done
"$BIN/asyncrl-compare" "$OUT" --threshold 18
"$BIN/asyncrl-compare" "$OUT" --threshold 20
