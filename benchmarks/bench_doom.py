"""Env-only VizDoom throughput: agent steps/s of one process stepping its games one after another.

    .venv/bin/python benchmarks/bench_doom.py                               # doom_basic and doom_defend_the_center
    .venv/bin/python benchmarks/bench_doom.py doom_deathmatch_bots --envs 4 --windows 3 --seconds 3
    .venv/bin/python benchmarks/bench_doom.py doom_basic --hud both     # what drawing the status bar costs

Random actions, 3x72x128 frames, frameskip 4 (one agent step = 4 tics), same-step auto-reset, as a rollout
worker steps them but without a policy. After one warm-up window, each window gives the wall-clock steps/s and
the CPU time spent per step by this process and by the VizDoom engine processes it drives (its children):
`per core` = 1e6 / (CPU us per step) is the rate one fully used core would sustain, which a busy machine
distorts much less than the wall-clock rate. Prints the medians over the windows as a markdown table.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import psutil

from asyncrl.envs.doom import DoomVecEnv


def cpu_seconds(me: psutil.Process) -> tuple[float, float]:
    """(this process, its engine children) user + system CPU seconds."""
    own = me.cpu_times()
    engines = sum(sum(c.cpu_times()[:2]) for c in me.children(recursive=True))
    return own.user + own.system, engines


def bench(name: str, envs: int, windows: int, seconds: float, seed: int, hud: bool | None) -> dict[str, float]:
    env = DoomVecEnv(name, envs, hud=hud)
    try:
        n, drawn = env.num_envs, env.hud
        obs = np.zeros((n, *env.spec.obs_shape), env.spec.obs_dtype)
        final_obs, reward = np.zeros_like(obs), np.zeros(n, np.float32)
        terminated, truncated = np.zeros(n, bool), np.zeros(n, bool)
        rng = np.random.default_rng(seed)
        env.reset(seed, obs)
        me = psutil.Process()
        sps, own_us, engine_us, episodes = [], [], [], 0
        for window in range(windows + 1):  # window 0 warms up
            steps = 0
            own0, eng0 = cpu_seconds(me)
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                actions = rng.integers(0, env.spec.num_actions, n)
                episodes += len(env.step(actions, obs, reward, terminated, truncated, final_obs))
                steps += n
            wall = time.perf_counter() - start
            own1, eng1 = cpu_seconds(me)
            if window:
                sps.append(steps / wall)
                own_us.append(1e6 * (own1 - own0) / steps)
                engine_us.append(1e6 * (eng1 - eng0) / steps)
    finally:
        env.close()
    cpu_us = float(np.median(np.add(own_us, engine_us)))
    return dict(sps=float(np.median(sps)), sps_min=min(sps), sps_max=max(sps), own_us=float(np.median(own_us)),
                engine_us=float(np.median(engine_us)), cpu_us=cpu_us, per_core=1e6 / cpu_us, episodes=episodes,
                hud=drawn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("envs_names", nargs="*", default=["doom_basic", "doom_defend_the_center"], metavar="ENV")
    parser.add_argument("--envs", type=int, default=8, help="games stepped by the one process")
    parser.add_argument("--windows", type=int, default=5, help="measurement windows after the warm-up")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each window")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hud", choices=["scenario", "on", "off", "both"], default="scenario",
                        help="draw the status bar as the scenario does, always, never, or a row of each")
    args = parser.parse_args()
    huds = {"scenario": [None], "on": [True], "off": [False], "both": [False, True]}[args.hud]
    print(f"{args.envs} games in one process, random actions; medians of {args.windows} x {args.seconds:g} s windows")
    print("| env | status bar | agent steps/s (wall) | range | CPU us/step: python + engine | agent steps/s per core | "
          "frames/s per core |")
    print("|---|---|---|---|---|---|---|")
    for name in args.envs_names:
        for hud in huds:
            r = bench(name, args.envs, args.windows, args.seconds, args.seed, hud)
            print(f"| {name} | {'on' if r['hud'] else 'off'} | {r['sps']:,.0f} | "
                  f"{r['sps_min']:,.0f}-{r['sps_max']:,.0f} | "
                  f"{r['cpu_us']:,.0f}: {r['own_us']:,.0f} + {r['engine_us']:,.0f} | {r['per_core']:,.0f} | "
                  f"{4 * r['per_core']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
