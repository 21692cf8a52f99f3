#!/usr/bin/env bash
# The CUDA paths on a real GPU, in at most 8 minutes on one GPU with 16 cores: one PASS/FAIL/SKIP line per path,
# each with a figure, and the lines again in OUT/gpu_check.txt.
#
#   scripts/gpu_check.sh [--wheels DIR] [--python PY] [--out DIR] [--cpu-rehearsal] [--dry-run]
#
# It uses the machine's own torch (a CUDA build, >= 2.5) and no package index: asyncrl runs from this checkout
# (PYTHONPATH), and what the machine's Python lacks is installed from the wheels in DIR (default shared/wheels),
# fetched beforehand where PyPI is reachable with scripts/fetch_gpu_wheels.sh (docs/troubleshooting.md).
#   --python PY       the Python that has the CUDA torch (default python3)
#   --out DIR         run dirs, logs and gpu_check.txt (default /tmp/asyncrl-gpu-check, emptied first)
#   --cpu-rehearsal   every path on the CPU, shorter and smaller: checks this script's own plumbing without a GPU
#   --dry-run         print the plan (each path and its command) and run nothing
#   --compile-rows    only the --compile rows (eager / compile / compile + CUDA graphs / bf16-all, on Pong and on
#                     4,096 batched CartPole envs: docs/performance.md, "Compiled steps"), at most 12 minutes
# Without a CUDA device (and without --cpu-rehearsal) every CUDA path prints SKIP and the script exits 0.
# Exit code: 1 if any path failed, 0 otherwise.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="$ROOT/shared/wheels"
PY="python3"
OUT="/tmp/asyncrl-gpu-check"
REHEARSAL=0
DRY=0
COMPILE_ROWS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels) WHEELS="$2"; shift 2 ;;
        --python) PY="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --cpu-rehearsal) REHEARSAL=1; shift ;;
        --dry-run) DRY=1; shift ;;
        --compile-rows) COMPILE_ROWS=1; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

BUDGET_S="${GPU_CHECK_BUDGET_S:-470}"  # 8 minutes less the set-up; each path also has its own hard timeout
START=$(date +%s)
RESULTS="$OUT/gpu_check.txt"
if [ "$DRY" = 0 ]; then
    rm -rf "$OUT" && mkdir -p "$OUT" || { echo "gpu_check.sh: cannot create $OUT" >&2; exit 2; }
    : > "$RESULTS"
fi
FAILS=0

say() {  # STATUS NAME FIGURE: one result line
    local line
    line=$(printf '%-4s  %-28s %s' "$1" "$2" "$3")
    echo "$line"
    [ "$DRY" = 1 ] || echo "$line" >> "$RESULTS"
    [ "$1" = FAIL ] && FAILS=$((FAILS + 1))
    return 0
}

fits() {  # ESTIMATE_S: true when the path is expected to end within the budget
    [ $(( $(date +%s) - START + $1 )) -le "$BUDGET_S" ]
}

cap() {  # LIMIT_S: the path's own timeout, cut so that no path ends later than 20 s past the budget
    local left=$(( BUDGET_S + 20 - $(date +%s) + START ))
    [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

# ----- set-up: the machine's torch, asyncrl from this checkout, the other packages from the wheels -----
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
NEEDED="import gymnasium, faster_fifo, ale_py, setproctitle, psutil, numpy, yaml, tensorboard, torch"
if [ "$DRY" = 0 ] && ! "$PY" -c "$NEEDED" 2>/dev/null; then
    if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$OUT/site" "$WHEELS"/*.whl \
            > "$OUT/pip.log" 2>&1 || { say FAIL setup "pip could not install $WHEELS/*.whl (see $OUT/pip.log)"; exit 1; }
        export PYTHONPATH="$PYTHONPATH:$OUT/site"
    fi
    if ! err=$("$PY" -c "$NEEDED" 2>&1); then
        say FAIL setup "$(echo "$err" | tail -1); fetch the wheels first: scripts/fetch_gpu_wheels.sh (with --all for a bare Python)"
        exit 1
    fi
fi
if [ "$DRY" = 1 ]; then
    CUDA=1; GPUS=1; GPU="(dry run)"
else
    read -r CUDA GPUS GPU < <("$PY" -c "import torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(int(n > 0), n, torch.__version__, torch.cuda.get_device_name(0) if n else 'no CUDA device')")
    say INFO setup "python $("$PY" -c 'import platform; print(platform.python_version())'), torch $GPU, $GPUS GPU(s), $(nproc) cores"
fi

if [ "$REHEARSAL" = 1 ]; then  # the plumbing on the CPU: small and short (7-8 minutes on a 2-core machine)
    DEV=cpu; PONG_WORKERS=2; PONG_LAYOUT=(--envs-per-worker 4 --rollout 16 --batch-size 128); T_CART=20; T_PONG=30
    T_SAC=20; RESUME_FRAMES=10000; BUDGET_S="${GPU_CHECK_BUDGET_S:-900}"
else
    DEV=cuda; PONG_WORKERS=16; PONG_LAYOUT=(); T_CART=35; T_PONG=35; T_SAC=40; RESUME_FRAMES=30000
fi
if [ "$CUDA" = 0 ] && [ "$REHEARSAL" = 0 ]; then
    for path in cartpole-appo resume load-policy-cuda load-policy-no-gpu enjoy-cuda enjoy-no-gpu-auto \
                export-torchscript-no-gpu export-onnx notebook-refused notebook-nvml-trains cuda-tensors sac-per \
                pong-fps-default pong-fps-1-learner-thread pong-bf16 remote-cpu-actors nccl-2-ranks \
                pong-eager pong-compile pong-cudagraphs pong-bf16-all cartpole-4096-eager cartpole-4096-compile \
                cartpole-4096-cudagraphs cartpole-4096-bf16-all; do
        say SKIP "$path" "no CUDA device here (--cpu-rehearsal runs the paths on the CPU)"
    done
    exit 0
fi
TAG=""; [ "$REHEARSAL" = 1 ] && TAG=" [cpu rehearsal]"

# ----- helpers -----
FIG="$OUT/figures.py"
[ "$DRY" = 1 ] || cat > "$FIG" <<'EOF'
"""figures RUN_DIR [SKIP]: frames, median frames/s after the first two records (start-up, warm-up) of this
run (SKIP: records an earlier run of the experiment wrote), last mean return; exit 1 if this run trained
nothing or the experiment has no checkpoint."""
import glob, json, os, statistics, sys

run, skip = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
every = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if line.startswith("{")]
records, before = every[skip:], max((r.get("frames", 0) for r in every[:skip]), default=0)
frames = max(0, max((r.get("frames", 0) for r in records), default=0) - before)
fps = [r["fps"] for r in records[2:] if r.get("fps")] or [r["fps"] for r in records if r.get("fps")]
ret = next((r["episode_return_mean"] for r in reversed(records) if r.get("episode_return_mean") is not None), None)
ckpts = glob.glob(os.path.join(run, "checkpoints", "ckpt_*.pt"))
ret_text = "-" if ret is None else f"{ret:.1f}"
print(f"{frames:,} frames{f' after {before:,}' if before else ''}, {statistics.median(fps) if fps else 0:,.0f} frames/s (median), return {ret_text}, "
      f"{len(ckpts)} checkpoint(s)")
sys.exit(0 if frames > 0 and ckpts else 1)
EOF

train() {  # NAME ESTIMATE_S TIMEOUT_S -- asyncrl-train flags: trains into OUT/runs/NAME (RUN_AS: another
    local name="$1" est="$2" limit="$3"; shift 4  # experiment's dir), one result line
    local exp="${RUN_AS:-$name}"
    local cmd=("$PY" -m asyncrl.cli.train --train-dir "$OUT/runs" --experiment "$exp" --report-interval 5 "$@")
    if [ "$DRY" = 1 ]; then say PLAN "$name" "${cmd[*]}"; return 0; fi
    if ! fits "$est"; then say SKIP "$name" "out of the ${BUDGET_S} s budget"; return 0; fi
    local t0=$SECONDS
    if timeout "$(cap "$limit")" "${cmd[@]}" > "$OUT/$name.log" 2>&1; then
        local fig
        if fig=$("$PY" "$FIG" "$OUT/runs/$exp" "${FIG_SKIP:-0}" 2>&1); then
            say PASS "$name" "$fig in $((SECONDS - t0)) s$TAG"
        else
            say FAIL "$name" "$fig (see $OUT/$name.log)"
        fi
    else
        say FAIL "$name" "exit $? after $((SECONDS - t0)) s: $(grep -m1 -E 'error|Error' "$OUT/$name.log" | cut -c1-160) (see $OUT/$name.log)"
    fi
}

check() {  # NAME ESTIMATE_S TIMEOUT_S ENV COMMAND...: PASS with the command's last output line as the figure
    local name="$1" est="$2" limit="$3" env="$4"; shift 4
    if [ "$DRY" = 1 ]; then say PLAN "$name" "${env:+$env }$*"; return 0; fi
    if ! fits "$est"; then say SKIP "$name" "out of the ${BUDGET_S} s budget"; return 0; fi
    local t0=$SECONDS
    if env $env timeout "$(cap "$limit")" "$@" > "$OUT/$name.log" 2>&1; then
        say PASS "$name" "$(tail -1 "$OUT/$name.log" | cut -c1-200) ($((SECONDS - t0)) s)$TAG"
    else
        say FAIL "$name" "exit $?: $(tail -1 "$OUT/$name.log" | cut -c1-200) (see $OUT/$name.log)"
    fi
}

# --compile (docs/performance.md, "Compiled steps"): the same command eager, compiled, compiled with CUDA graphs,
# and compiled in bf16 (autocast over the whole forward), on Pong and on 4,096 batched CartPole envs; each row
# says its first-frames time and its compile times beside the frames/s
compile_rows() {
    local cart=(--env CartPole-v1 --workers 2 --envs-per-worker 2048 --rollout 16 --batch-size 65536 --minibatches 4)
    [ "$REHEARSAL" = 1 ] && cart=(--env CartPole-v1 --workers 2 --envs-per-worker 256 --rollout 16 --batch-size 8192 --minibatches 4)
    local arm flags
    for arm in eager compile cudagraphs bf16-all; do
        case "$arm" in
            eager) flags=() ;;
            compile) flags=(--compile all) ;;
            cudagraphs) flags=(--compile all --compile-mode reduce-overhead) ;;
            bf16-all) flags=(--compile all --precision bf16-all) ;;
        esac
        if [ "$REHEARSAL" = 1 ] && [ "$arm" = cudagraphs ]; then
            say SKIP pong-cudagraphs "CUDA graphs need a GPU"; say SKIP cartpole-4096-cudagraphs "CUDA graphs need a GPU"
            continue
        fi
        train "pong-$arm" $((T_PONG + 40)) 180 -- --env atari_pong --device "$DEV" --workers "$PONG_WORKERS" \
            "${PONG_LAYOUT[@]}" "${flags[@]}" --seconds $((T_PONG + 10)) --checkpoint-interval 1000
        compile_note "pong-$arm"
        train "cartpole-4096-$arm" $((T_CART + 40)) 180 -- "${cart[@]}" --device "$DEV" "${flags[@]}" \
            --seconds $((T_CART + 10)) --checkpoint-interval 1000
        compile_note "cartpole-4096-$arm"
    done
}

compile_note() {  # NAME: the run's first-frames and compile times, from its log
    [ "$DRY" = 1 ] || [ ! -f "$OUT/$1.log" ] && return 0
    say INFO "$1" "$(grep -oE 'first frames [0-9.]+ s after start|compiled in [0-9.]+ s' "$OUT/$1.log" | paste -sd ';' -)"
}

if [ "$COMPILE_ROWS" = 1 ]; then
    BUDGET_S="${GPU_CHECK_BUDGET_S:-720}"
    compile_rows
    [ "$DRY" = 1 ] && exit 0
    echo "gpu_check.sh --compile-rows: $(grep -c '^PASS' "$RESULTS") passed, $FAILS failed in $(( $(date +%s) - START )) s; lines in $RESULTS"
    [ "$FAILS" = 0 ]
    exit
fi

# ----- the paths -----
CART="$OUT/runs/cartpole-appo"
train cartpole-appo $((T_CART + 25)) 150 -- --env CartPole-v1 --device "$DEV" --seconds "$T_CART" --checkpoint-interval 10

# resume on CUDA: 30,000 more frames from the checkpoint (the optimizer's and generators' states come back)
if [ "$DRY" = 1 ] || [ -d "$CART/checkpoints" ]; then
    FRAMES=$([ "$DRY" = 1 ] && echo 0 || "$PY" -c "import json,sys; print(max(json.loads(l).get('frames', 0) for l in open(sys.argv[1])))" "$CART/metrics.jsonl" 2>/dev/null || echo 0)
    RECORDS=$([ "$DRY" = 1 ] && echo 0 || grep -c . "$CART/metrics.jsonl")
    RUN_AS=cartpole-appo FIG_SKIP=$RECORDS train resume 30 120 -- --env CartPole-v1 --device "$DEV" --resume \
        --frames $((FRAMES + RESUME_FRAMES)) --seconds 0
    [ "$DRY" = 1 ] || grep -q "resumed from" "$OUT/resume.log" || say FAIL resume "no 'resumed from' line in $OUT/resume.log"
else
    say SKIP resume "cartpole-appo left no checkpoint"
fi

POLICY_EPISODE='import sys, gymnasium as gym, numpy as np, asyncrl
policy = asyncrl.load_policy(sys.argv[1], device=sys.argv[2])
env = gym.make("CartPole-v1"); obs, _ = env.reset(seed=0); score, done = 0.0, False
while not done:
    obs, r, term, trunc, _ = env.step(int(policy(obs))); score += r; done = term or trunc
print(f"greedy episode score {score:g} with the policy on {policy.device}")'
if [ "$DRY" = 1 ] || [ -d "$CART/checkpoints" ]; then
    check load-policy-$DEV 20 60 "" "$PY" -c "$POLICY_EPISODE" "$CART" "$DEV"
    check load-policy-no-gpu 20 60 "CUDA_VISIBLE_DEVICES=" "$PY" -c "$POLICY_EPISODE" "$CART" cpu
    check enjoy-$DEV 20 60 "" "$PY" -m asyncrl.cli.enjoy "$CART" --episodes 2 --device "$DEV"
    check enjoy-no-gpu-auto 20 60 "CUDA_VISIBLE_DEVICES=" "$PY" -m asyncrl.cli.enjoy "$CART" --episodes 2 --device auto
    EXPORT='"$0" -m asyncrl.cli.export "$1" --format "$2" --out "$3" && stat -c "%n: %s bytes" "$3"'
    check export-torchscript-no-gpu 20 90 "CUDA_VISIBLE_DEVICES=" bash -c "$EXPORT" "$PY" "$CART" torchscript "$OUT/policy.pt"
    check export-onnx 30 120 "" bash -c "$EXPORT" "$PY" "$CART" onnx "$OUT/policy.onnx"
else
    say SKIP load-policy "cartpole-appo left no checkpoint"
fi

# the notebook idiom: torch.cuda.is_available() before asyncrl.train() must be refused in one line, and with
# PYTORCH_NVML_BASED_CUDA_CHECK=1 (NVML answers instead of the driver) the same cell must train
NOTEBOOK='import sys, torch, asyncrl
print("cuda available:", torch.cuda.is_available())
try:
    result = asyncrl.train(env="CartPole-v1", device=sys.argv[1], frames=20000, train_dir=sys.argv[2], experiment=sys.argv[3])
except asyncrl.ForkError as exc:
    print(f"refused: {exc}"); sys.exit(3)
frames = result.metrics.get("frames", 0)
print(f"trained {frames:,} frames after torch.cuda.is_available(), stop: {result.stop_reason}")'
if [ "$DRY" = 1 ]; then
    say PLAN notebook-fork "$PY -c '<torch.cuda.is_available(); asyncrl.train(...)>' with and without PYTORCH_NVML_BASED_CUDA_CHECK=1"
elif [ "$REHEARSAL" = 1 ]; then
    say SKIP notebook-refused "needs the CUDA driver (a CPU torch never loads it)"
elif fits 20; then
    env PYTORCH_NVML_BASED_CUDA_CHECK=0 timeout "$(cap 60)" "$PY" -c "$NOTEBOOK" cuda "$OUT/runs" notebook-refused > "$OUT/notebook-refused.log" 2>&1
    rc=$?
    if [ $rc = 3 ] && grep -q "PYTORCH_NVML_BASED_CUDA_CHECK=1" "$OUT/notebook-refused.log"; then
        say PASS notebook-refused "refused in one line naming PYTORCH_NVML_BASED_CUDA_CHECK=1"
    else
        say FAIL notebook-refused "exit $rc: $(tail -1 "$OUT/notebook-refused.log" | cut -c1-160)"
    fi
fi
[ "$DRY" = 1 ] || check notebook-nvml-trains 40 120 "PYTORCH_NVML_BASED_CUDA_CHECK=1" "$PY" -c "$NOTEBOOK" "$DEV" "$OUT/runs" notebook-nvml

# CUDA tensors: the return normaliser pooled beside the observation normaliser (the torchrun vector), a
# checkpoint mapped onto the GPU still restores the generators, every PolicyHead buffer on the GPU
TENSORS='import sys, torch
from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec
from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.agents.rng_state import load_rng_state, rng_state
from asyncrl.algo.moment_sync import MomentSync, moment_modules
from asyncrl.policy import PolicyHead
dev = torch.device(sys.argv[1])
cfg, spec = Config(env="Pendulum-v1", normalize_obs=True, normalize_returns=True), make_env_spec("Pendulum-v1")
learner = APPOLearner(cfg, spec, dev)
delta = MomentSync(moment_modules(learner.model, learner.return_normalizer)).delta()
state = {k: (v.to(dev) if torch.is_tensor(v) else v) for k, v in rng_state().items()}
expected = torch.rand(3); load_rng_state(state); assert torch.equal(torch.rand(3), expected)
devices = {b.device.type for b in PolicyHead(learner.model, spec).buffers()}
assert devices == {dev.type}, devices
gpu_rng = "no CUDA generator"
if dev.type == "cuda":  # the CUDA generators are saved once CUDA is in use, and restored
    saved = rng_state(); drawn = torch.rand(3, device=dev); load_rng_state(saved)
    assert "cuda_rng" in saved and torch.equal(torch.rand(3, device=dev), drawn)
    gpu_rng = f"{len(saved['cuda_rng'])} CUDA generator(s) restored"
print(f"moment vector of {delta.numel()} on {delta.device}; CPU RNG restored from {dev.type}; {gpu_rng}; "
      f"head buffers on {devices}")'
check cuda-tensors 15 60 "" "$PY" -c "$TENSORS" "$DEV"

train sac-per $((T_SAC + 20)) 150 -- --env Pendulum-v1 --algo sac --per --device "$DEV" --seconds "$T_SAC" --checkpoint-interval 10

# Pong: APPO on CUDA with 16 workers and the default learner threads (the "Pong APPO on CUDA" path and its
# frames/s figure), then with one learner thread, then bf16
train pong-fps-default $((T_PONG + 25)) 150 -- --env atari_pong --device "$DEV" --workers "$PONG_WORKERS" "${PONG_LAYOUT[@]}" --seconds "$T_PONG" --checkpoint-interval 15
train pong-fps-1-learner-thread $((T_PONG + 25)) 150 -- --env atari_pong --device "$DEV" --workers "$PONG_WORKERS" "${PONG_LAYOUT[@]}" --learner-threads 1 --seconds "$T_PONG" --checkpoint-interval 15
train pong-bf16 $((T_PONG + 20)) 150 -- --env atari_pong --device "$DEV" --workers "$PONG_WORKERS" "${PONG_LAYOUT[@]}" --precision bf16 --seconds $((T_PONG - 10)) --checkpoint-interval 10

# a CUDA learner fed by remote CPU actors only: a Ray cluster of two nodes on this machine (loopback), 4 remote
# groups of Pong on the second node, none local (docs/ray.md); SKIP where ray does not import
REMOTE='import sys, subprocess, statistics, pathlib
from asyncrl.bench.ray_cluster import LocalCluster
from asyncrl.diagnostics.metrics import read_metrics
dev, out, seconds = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
out.mkdir(parents=True, exist_ok=True)
with LocalCluster(out, head_cpus=0, node_cpus=(4,)) as cluster:
    subprocess.run([sys.executable, "-m", "asyncrl.cli.train", "--env", "atari_pong", "--device", dev, "--workers", "0",
                    "--remote-workers", "4", "--ray", cluster.address, "--seconds", seconds, "--report-interval", "5",
                    "--train-dir", str(out), "--experiment", "remote"], check=True)
rs = [r for r in read_metrics(str(out / "remote")) if r.get("remote_share")][1:]
fps = statistics.median(r["fps"] for r in rs)
lag = statistics.median(r["remote_lag_mean"] for r in rs if r.get("remote_lag_mean") is not None)
last = rs[-1]
share, mb, version = last["remote_share"], last["remote_bytes_per_s"] / 1e6, last["policy_version"]
print(f"{dev} learner, 4 remote CPU groups: median {fps:,.0f} frames/s, remote share {share:.0%}, "
      f"arrival lag {lag:.1f}, {mb:.1f} MB/s through Ray, version {version}")'
if [ "$DRY" = 0 ] && ! "$PY" -c "import ray" 2>/dev/null; then
    say SKIP remote-cpu-actors "ray does not import here: scripts/fetch_gpu_wheels.sh --all fetches it"
else
    check remote-cpu-actors $((T_PONG + 60)) 240 "" "$PY" -c "$REMOTE" "$DEV" "$OUT/runs/remote-cluster" $((T_PONG + 25))
fi

# Isaac Lab (isaaclab:<task>, asyncrl/envs/isaaclab_env.py): its cart-pole in Isaac Sim on the GPU, the one worker
# owning the sim; SKIP where Isaac Lab does not import (it needs Isaac Sim, which no wheel here brings)
if [ "$DRY" = 0 ] && ! "$PY" -c "import isaaclab" 2>/dev/null; then
    say SKIP isaaclab-cartpole "Isaac Lab does not import here (pip install isaaclab[isaacsim], with Isaac Sim's GPU)"
else
    train isaaclab-cartpole 150 300 -- --env isaaclab:Isaac-Cartpole-Direct-v0 --device "$DEV" --workers 1 \
        --worker-splits 1 --envs-per-worker 1024 --seconds 60 --checkpoint-interval 30
fi

# 2-rank NCCL with both normalisers (the mujoco preset's): NCCL takes one GPU per rank
if [ "$DRY" = 0 ] && { [ "$REHEARSAL" = 1 ] || [ "${GPUS:-0}" -lt 2 ]; }; then
    say SKIP nccl-2-ranks "needs 2 GPUs (NCCL runs one rank per GPU); this machine has ${GPUS:-0}"
else
    check nccl-2-ranks 70 150 "" "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 -m asyncrl.train \
        --env CartPole-v1 --device cuda --normalize-obs --normalize-returns --seconds 40 --train-dir "$OUT/runs" --experiment nccl
fi

compile_rows  # last: they SKIP once the budget is spent (--compile-rows runs them alone)

[ "$DRY" = 1 ] && exit 0
echo "gpu_check.sh: $(grep -c '^PASS' "$RESULTS") passed, $FAILS failed, $(grep -c '^SKIP' "$RESULTS") skipped in $(( $(date +%s) - START )) s; lines in $RESULTS"
[ "$FAILS" = 0 ]
