"""Train PPO (APPO) on your own gymnasium env, then load the policy and play one greedy episode.

    .venv/bin/python examples/custom_env.py                   # 30,000 env steps, about a minute on 2 cores
    .venv/bin/python examples/custom_env.py --frames 2000     # a smoke run

The env is a class in this file; asyncrl builds it in its worker processes from the name `custom_env:Walk`
(this file's directory is on the import path when you run it, and the workers are forked from it).
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np


class Walk(gym.Env):
    """Walk from 0 to `goal` on a line: -1 per step, 50 steps at most; the best return is 1 - goal."""

    def __init__(self, goal: int = 5):
        self.goal = goal
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.pos, self.t = 0, 0
        return np.array([self.pos / self.goal], np.float32), {}

    def step(self, action: int):
        self.pos += 1 if action == 1 else -1
        self.t += 1
        reached = self.pos == self.goal
        obs = np.clip(np.array([self.pos / self.goal], np.float32), -1, 1)
        return obs, 0.0 if reached else -1.0, reached, self.t >= 50, {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=30_000, help="env steps to train for")
    parser.add_argument("--train-dir", default="train_dir", help="where the run is written")
    args = parser.parse_args()

    import asyncrl  # train before any torch work in this process (the workers are forked from it)

    result = asyncrl.train(env="custom_env:Walk", env_kwargs={"goal": 5}, frames=args.frames, seed=0,
                           train_dir=args.train_dir, experiment="walk")
    print(f"{result.run_dir}: mean return {result.metrics.get('episode_return_mean')} (best possible: -4)")

    policy = asyncrl.load_policy(result.run_dir)  # raw observation -> action, as a torch module
    env, total, done = Walk(goal=5), 0.0, False
    obs, _ = env.reset(seed=0)
    while not done:
        obs, reward, terminated, truncated, _ = env.step(int(policy(obs)))
        total, done = total + reward, terminated or truncated
    print(f"one greedy episode: return {total}")


if __name__ == "__main__":
    main()
