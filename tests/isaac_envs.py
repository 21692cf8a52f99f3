"""A torch vector env with Isaac Lab's DirectRLEnv interface, on the CPU: cart-pole balancing for tests of
`isaaclab:` (asyncrl/envs/isaaclab_env.py), which cannot run Isaac Sim here.

Like Isaac Lab's: `num_envs`, `device`, a Dict observation space with a "policy" entry, `reset(seed=...)` ->
(obs, extras), `step(actions)` -> (obs, reward, terminated, truncated, extras) as tensors on `device`, ended envs
reset inside the step (no final observation), `extras["time_outs"]` the truncations, `extras["log"]` metrics.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch


class TorchCartPole:
    """`num_envs` cart-poles pushed by a force in [-1, 1] x 10 N; +1 a step while upright; cut at `max_steps`."""

    def __init__(self, num_envs: int, device: str = "cpu", max_steps: int = 100) -> None:
        self.num_envs, self.device, self.max_episode_length = num_envs, torch.device(device), max_steps
        self.single_observation_space = gym.spaces.Dict({"policy": gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)})
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.state = torch.zeros(num_envs, 4, device=self.device)
        self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.generator = torch.Generator(device=self.device)
        self.actions_seen: list[torch.Tensor] = []  # what step() was given (tests read it)

    def _reset_idx(self, ids: torch.Tensor) -> None:
        noise = torch.rand(len(ids), 4, generator=self.generator, device=self.device)
        self.state[ids] = (noise - 0.5) * 0.1
        self.episode_length_buf[ids] = 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.generator.manual_seed(seed)
        self._reset_idx(torch.arange(self.num_envs, device=self.device))
        return {"policy": self.state.clone()}, {}

    def step(self, action: torch.Tensor) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        self.actions_seen.append(action)
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        force = 10.0 * action[:, 0].clamp(-1, 1)
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + 0.05 * theta_dot**2 * sin) / 1.1
        theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
        x_acc = temp - 0.05 * theta_acc * cos / 1.1
        self.state = torch.stack([x + 0.02 * x_dot, x_dot + 0.02 * x_acc, theta + 0.02 * theta_dot,
                                  theta_dot + 0.02 * theta_acc], 1)
        self.episode_length_buf += 1
        terminated = (self.state[:, 0].abs() > 2.4) | (self.state[:, 2].abs() > 0.21)
        truncated = self.episode_length_buf >= self.max_episode_length
        reward = torch.ones(self.num_envs, device=self.device)
        extras = {"time_outs": truncated, "log": {"upright": (~terminated).float().mean()}}
        ended = torch.nonzero(terminated | truncated).flatten()
        if len(ended):
            self._reset_idx(ended)
        return {"policy": self.state.clone()}, reward, terminated, truncated, extras

    def close(self) -> None:
        pass


def cartpole(num_envs: int, max_steps: int = 100) -> TorchCartPole:
    """`isaaclab:tests.isaac_envs:cartpole`."""
    return TorchCartPole(num_envs, max_steps=max_steps)
