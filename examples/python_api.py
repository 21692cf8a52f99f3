"""docs/python-api.md's example: train CartPole-v1 with asyncrl.train(), then play it with asyncrl.load_policy().

    .venv/bin/python examples/python_api.py                # 150k env steps: a policy that scores 500
    .venv/bin/python examples/python_api.py --frames 2000  # a smoke run

The run goes to train_dir/cartpole_api in the current directory.
"""

import argparse

import gymnasium as gym

import asyncrl

if __name__ == "__main__":  # the workers are forked from this process; the guard keeps the script importable
    parser = argparse.ArgumentParser(description="train CartPole-v1, then play 5 greedy episodes")
    parser.add_argument("--frames", type=int, default=500_000, help="env steps to train (default: %(default)s)")
    args = parser.parse_args()

    result = asyncrl.train(env="CartPole-v1", frames=args.frames, experiment="cartpole_api")
    print(f"{result.run_dir}: {result.metrics['frames']} frames, mean return {result.metrics['episode_return_mean']}")

    policy = asyncrl.load_policy(result.run_dir)  # greedy; load_policy(..., sample=True) samples
    env = gym.make("CartPole-v1")
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        score, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(obs))
            score, done = score + reward, terminated or truncated
        print(f"episode {seed}: {score:.0f}")
