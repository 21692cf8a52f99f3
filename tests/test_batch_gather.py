"""`gather_batch`: every field of several slots, taken out of order from a real trajectory buffer, lands in the
column of the env that wrote it: time-major fields at `[t, k * E + e]`, per-env fields (`final_obs`,
`final_step`) at `[k * E + e]` for the k-th slot asked for, `valid` included, for Box and Dict observations."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from asyncrl.agents.batch import gather_batch
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec, ObsKey
from asyncrl.runtime.plumbing.trajectories import allocate_trajectories, num_slots

F32 = np.dtype(np.float32)
ACTIONS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
BOX = EnvSpec("box", (3,), F32, ACTIONS, 1)
DICT = EnvSpec("dict", (), F32, ACTIONS, 1, obs_keys=(ObsKey("pos", (2,), F32), ObsKey("vel", (3,), F32)))
# 2 workers x 2 splits of 3 envs; a batch is 3 slots
CFG = Config(env="Pendulum-v1", workers=2, envs_per_worker=6, worker_splits=2, rollout=4, batch_size=36)
SLOTS = [4, 0, 2]  # out of order, not the first ones
VERSION = 50


def fill(traj) -> None:
    """Every element of every slot says where it is: slot, step, env (and which field)."""
    rng = np.random.default_rng(0)
    for j, (name, array) in enumerate(traj.items()):
        if name in ("terminated", "truncated", "valid"):
            array[...] = rng.random(array.shape) < 0.5
        elif name == "final_step":
            array[...] = rng.integers(-1, CFG.rollout, array.shape)
        elif name == "versions":
            array[...] = VERSION - rng.integers(0, 9, array.shape)
        else:
            index = np.indices(array.shape).reshape(array.ndim, -1)
            code = sum(i * 10.0 ** d for d, i in enumerate(reversed(index)))  # every index < 10: unique per cell
            array[...] = (code + j * 1e5).reshape(array.shape)  # and per field (exact in float32)


@pytest.mark.parametrize("spec", [BOX, DICT], ids=["box", "dict"])
def test_every_field_lands_in_its_envs_column(spec: EnvSpec) -> None:
    traj = allocate_trajectories(CFG, spec)
    assert traj["valid"].shape[0] == num_slots(CFG) > max(SLOTS)
    fill(traj)
    batch = gather_batch(traj, np.asarray(SLOTS), VERSION, torch.device("cpu"))
    T, E = CFG.rollout, CFG.envs_per_split
    assert E == 3 and batch.rewards.shape == (T, len(SLOTS) * E)
    keys = [k.key for k in spec.obs_keys]
    for k, slot in enumerate(SLOTS):
        for e in range(E):
            b = k * E + e
            for key in keys or [None]:
                obs, final = ((batch.obs, batch.final_obs) if key is None else
                              (batch.obs[key], batch.final_obs[key]))
                name, final_name = ("obs", "final_obs") if key is None else (f"obs/{key}", f"final_obs/{key}")
                np.testing.assert_array_equal(obs[:, b].numpy(), traj[name][slot, :, e])  # T + 1 steps
                np.testing.assert_array_equal(final[b].numpy(), traj[final_name][slot, e])
            assert int(batch.final_step[b]) == traj["final_step"][slot, e]
            for field in ("actions", "rewards", "terminated", "truncated", "valid"):
                np.testing.assert_array_equal(getattr(batch, field)[:, b].numpy(), traj[field][slot, :, e], field)
            np.testing.assert_array_equal(batch.behaviour_logp[:, b].numpy(), traj["logp"][slot, :, e])
            np.testing.assert_array_equal(batch.lag[:, b].numpy(), VERSION - traj["versions"][slot])
    assert batch.valid is not None and batch.valid.dtype == torch.bool and not batch.valid.all()
    assert batch.terminated.dtype == batch.truncated.dtype == torch.bool
    # The learners' views built on these fields: the final observation belongs to its env's truncation step.
    steps = torch.arange(T).unsqueeze(1)
    assert torch.equal(batch.has_final(), batch.truncated & (steps == batch.final_step.unsqueeze(0)))
    assert batch.has_final().any()
    expected_mask = torch.from_numpy(np.concatenate([traj["valid"][s] for s in SLOTS], axis=1)).float()
    lag_ok = batch.lag <= 4
    assert torch.equal(batch.trainable(4), lag_ok.float() * expected_mask)
