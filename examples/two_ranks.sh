#!/usr/bin/env bash
# Two data-parallel learners with torchrun on one machine (CPU: gloo; add --device cuda for NCCL, one GPU a rank).
# Each rank is a whole asyncrl run (its own workers and envs); gradients are averaged after every backward pass.
#   examples/two_ranks.sh                    # CartPole, 150k env steps per rank
#   examples/two_ranks.sh --frames 1000      # a smoke run; any asyncrl-train flag is passed on
# Rank 0 writes train_dir/two_ranks/, rank 1 its metrics under train_dir/two_ranks/rank1/ (docs/scaling.md).
set -euo pipefail
BIN="${BIN:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin}"
PORT="${PORT:-29517}"
exec "$BIN/torchrun" --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$PORT" \
    -m asyncrl.train --env CartPole-v1 --frames 150000 --workers 1 --experiment two_ranks "$@"
