"""docs/python-api.md's example: train CartPole-v1 with asyncrl.train(), then play it with asyncrl.load_policy()."""

import gymnasium as gym

import asyncrl

if __name__ == "__main__":  # the workers are forked from this process; the guard keeps the script importable
    result = asyncrl.train(env="CartPole-v1", frames=150_000, experiment="cartpole_api")
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
