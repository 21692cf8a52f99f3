#!/usr/bin/env bash
# Learning with --compile beside eager, 3 seeds each, one run at a time at nice 19 (docs/performance.md,
# "Compiled steps"): CartPole-v1 with the README's command (500k frames, --compile all) and Pendulum-v1 SAC
# (15k env steps, --compile learner), then asyncrl-compare per task (IQM, and the frames to 475 / -200).
#
#   scripts/compile_learning.sh [OUT]    # default runs/compile_learning
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
OUT="${1:-runs/compile_learning}"
for seed in 0 1 2; do
    for arm in eager compiled; do
        cart=(); sac=()
        [ "$arm" = compiled ] && cart=(--compile all) && sac=(--compile learner)
        nice -n 19 "$BIN/asyncrl-train" --env CartPole-v1 --frames 500000 --seed "$seed" "${cart[@]}" \
            --train-dir "$OUT/cartpole_$arm" --experiment "seed$seed" > "$OUT.cartpole_${arm}_$seed.log" 2>&1
        nice -n 19 "$BIN/asyncrl-train" --env Pendulum-v1 --algo sac --frames 15000 --seed "$seed" "${sac[@]}" \
            --train-dir "$OUT/sac_$arm" --experiment "seed$seed" > "$OUT.sac_${arm}_$seed.log" 2>&1
    done
done
"$BIN/asyncrl-compare" "$OUT/cartpole_eager" "$OUT/cartpole_compiled" --threshold 475
"$BIN/asyncrl-compare" "$OUT/sac_eager" "$OUT/sac_compiled" --metric episode_return_mean_20 --threshold -200
