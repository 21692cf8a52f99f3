"""SAC on a MuJoCo task (HalfCheetah-v5 by default), then an evaluation of the greedy policy.

    .venv/bin/python examples/sac_mujoco.py                              # 300k env steps: about 2 h on 2 cores
    .venv/bin/python examples/sac_mujoco.py --frames 500 --learning-starts 200   # a smoke run

Needs the mujoco extra (`pip install -e '.[mujoco]'`; `make install` installs it). docs/results.md has the
figure this reproduces (6,873 at 300k env steps, one seed) and docs/off-policy.md the settings.
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5", help="a gymnasium MuJoCo id")
    parser.add_argument("--frames", type=int, default=300_000, help="env steps to train for")
    parser.add_argument("--learning-starts", type=int, default=5000, help="random env steps before updates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-dir", default="train_dir", help="where the run is written")
    args = parser.parse_args()

    import asyncrl

    result = asyncrl.train(env=args.env, algo="sac", frames=args.frames, learning_starts=args.learning_starts,
                           seed=args.seed, learner_threads=1, train_dir=args.train_dir,
                           experiment=f"sac_{args.env}_seed{args.seed}")
    print(f"{result.run_dir}: stopped on {result.stop_reason}, mean return "
          f"{result.metrics.get('episode_return_mean')}")

    import gymnasium as gym

    policy = asyncrl.load_policy(result.run_dir)  # the tanh of the Gaussian mean: the greedy action
    env = gym.make(args.env)
    obs, _ = env.reset(seed=args.seed)
    total, done, steps = 0.0, False, 0
    while not done and steps < 1000:
        obs, reward, terminated, truncated, _ = env.step(policy(obs))
        total, done, steps = total + float(reward), terminated or truncated, steps + 1
    print(f"one greedy episode of {steps} steps: return {total:.1f}")


if __name__ == "__main__":
    main()
