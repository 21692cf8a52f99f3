"""Env hooks in one script: an action mask, env metrics, a curriculum and a callback that stops the run.

    .venv/bin/python examples/env_hooks.py                  # up to 100,000 env steps; stops once solved
    .venv/bin/python examples/env_hooks.py --frames 2000    # a smoke run

The env (`env_hooks:Doors`) shows four doors, of which the mask opens some; walking into a closed door ends the
episode. It reports how far it got (`info_depth`) and how many doors were open (`info_open`) as env metrics, and
closes more doors as the agent gets better (`set_training_info`). A callback stops the run when the mean return
reaches the goal with two doors open.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

LENGTH = 10


class Doors(gym.Env):
    """Ten rooms; in each, the doors in `action_mask` are open; the highest open door pays 1, any other open one
    0, a closed one ends the episode. The fewer doors open, the harder: `set_training_info` closes doors as the
    mean return rises."""

    observation_space = gym.spaces.Dict({"open": gym.spaces.Box(0.0, 1.0, (4,), np.float32),
                                         "action_mask": gym.spaces.MultiBinary(4)})
    action_space = gym.spaces.Discrete(4)

    def __init__(self) -> None:
        self.open_doors = 3  # the difficulty: doors open per room (at least 1)
        self.mask = np.zeros(4, dtype=np.int8)
        self.depth = 0

    def set_training_info(self, info: dict) -> None:
        ret = info["episode_return_mean"]
        if ret is not None and ret > 0.9 * LENGTH:  # nearly solved: one door fewer (down to 2)
            self.open_doors = max(2, self.open_doors - 1)

    def _obs(self) -> dict:
        self.mask[:] = 0
        self.mask[self.np_random.choice(4, size=self.open_doors, replace=False)] = 1
        return {"open": self.mask.astype(np.float32), "action_mask": self.mask.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.depth = 0
        return self._obs(), {}

    def step(self, action):
        action = int(action)
        closed = not self.mask[action]
        reward = 0.0 if closed else float(action == int(np.flatnonzero(self.mask)[-1]))
        self.depth += not closed
        done = closed or self.depth >= LENGTH
        info = {"depth": self.depth}  # read at the episode's end with --info-keys / info_keys="depth"
        if done:
            info["episode_extra_stats"] = {"open": float(self.open_doors)}
        return self._obs(), reward, done, False, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=100_000, help="env steps to train for at most")
    parser.add_argument("--goal", type=float, default=9.5, help="mean return at which the callback stops the run")
    parser.add_argument("--doors", type=int, default=2, help="... once the curriculum is down to this many open doors")
    parser.add_argument("--train-dir", default="train_dir", help="where the run is written")
    parser.add_argument("--report-interval", type=float, default=5.0, help="seconds between the records it reads")
    args = parser.parse_args()

    import asyncrl  # train before any torch work in this process (the workers are forked from it)

    def stop_at_goal(record: dict) -> bool:
        if record["event"] == "metrics":
            print(f"  {record['frames']:>7,} frames: return {record['episode_return_mean']}, "
                  f"depth {record.get('info_depth')}, doors open {record.get('info_open')}")
            ret, doors = record["episode_return_mean"] or 0.0, record.get("info_open") or 4
            solved = ret >= args.goal and doors <= args.doors
            return not solved  # False stops the run, with a final checkpoint
        return True

    result = asyncrl.train(env="env_hooks:Doors", info_keys="depth", frames=args.frames, seed=0,
                           workers=2, envs_per_worker=4, report_interval=args.report_interval,
                           train_dir=args.train_dir, experiment="doors", callbacks=[stop_at_goal])
    print(f"{result.run_dir}: stopped on {result.stop_reason}; mean return {result.metrics['episode_return_mean']}")

    policy = asyncrl.load_policy(result.run_dir)  # the mask is one of its inputs: it never opens a closed door
    env, closed = Doors(), 0
    obs, _ = env.reset(seed=1)
    for _ in range(200):
        action = int(policy(obs))
        closed += not obs["action_mask"][action]
        obs, _, done, _, _ = env.step(action)
        if done:
            obs, _ = env.reset()
    print(f"200 greedy steps: {closed} closed doors walked into")


if __name__ == "__main__":
    main()
