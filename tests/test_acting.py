"""The acting contract (`asyncrl.agents.acting`): every model kind acts through `act(obs, state, first,
greedy)` with an empty state and the same outputs as its own primitives; the slots carry `first` and the
actor's state, which the real rollout worker writes and hands over to the next slot."""

from __future__ import annotations

import multiprocessing as mp
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from asyncrl.agents.acting import Actor, published_actor, reset_where_first, zero_state
from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.agents.batch import gather_batch
from asyncrl.agents.off_policy.sac import SACLearner
from asyncrl.agents.off_policy.td3 import TD3Learner
from asyncrl.config import Config
from asyncrl.envs.base import MASK_KEY, EnvSpec, ObsKey
from asyncrl.envs.registry import make_env_spec
from asyncrl.models.actor_critic import greedy_actions
from asyncrl.runtime.plumbing.channels import Channels
from asyncrl.runtime.plumbing.trajectories import allocate_trajectories, num_slots, trajectory_bytes, trajectory_layout
from asyncrl.runtime.roles.rollout_worker import run_rollout_worker
from tests.conftest import serve_request

F32 = np.dtype(np.float32)
SPECS = {
    "discrete": EnvSpec("d", (4,), F32, gym.spaces.Discrete(3), 1),
    "multi_discrete": EnvSpec("md", (4,), F32, gym.spaces.MultiDiscrete([2, 3]), 1),
    "box": EnvSpec("b", (4,), F32, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), 1),
    "tuple": EnvSpec("t", (4,), F32, gym.spaces.Tuple((gym.spaces.Discrete(3),
                                                       gym.spaces.Box(-1.0, 1.0, (1,), np.float32))), 1),
    "dict_masked": EnvSpec("m", (), F32, gym.spaces.Discrete(4), 1,
                           obs_keys=(ObsKey("state", (4,), F32), ObsKey(MASK_KEY, (4,), F32))),
}
N = 64


def _obs(spec: EnvSpec):
    g = torch.Generator().manual_seed(1)
    if not spec.is_dict:
        return torch.randn(N, *spec.obs_shape, generator=g)
    mask = (torch.rand(N, 4, generator=g) < 0.5).float()
    mask[:, 0] = 1.0
    return {"state": torch.randn(N, 4, generator=g), MASK_KEY: mask}


@pytest.mark.parametrize("kind", list(SPECS))
def test_actor_critic_acts_through_the_contract_as_before(kind: str) -> None:
    spec = SPECS[kind]
    model = APPOLearner.build_policy(spec, Config(env="CartPole-v1", normalize_obs=True), torch.device("cpu"))
    obs, first = _obs(spec), torch.ones(N, dtype=torch.bool)
    actor = published_actor(model)
    assert isinstance(actor, Actor) and actor.state_layout() == {} and actor.initial_state(N) == {}
    torch.manual_seed(3)
    want_actions, want_logp = model.act(obs)  # the policy workers' draw
    torch.manual_seed(3)
    actions, logp, state = actor.act(obs, {}, first)
    assert state == {}
    torch.testing.assert_close(actions, want_actions)
    torch.testing.assert_close(logp, want_logp)
    with torch.no_grad():
        policy_out, _ = model(obs)  # the evaluator's greedy path before the contract
        greedy, greedy_logp, _ = actor.act(obs, {}, first, greedy=True)
        torch.testing.assert_close(greedy, greedy_actions(policy_out, spec))
        torch.testing.assert_close(greedy_logp, model.distribution(policy_out).log_prob(greedy))
    if spec.masked:
        assert bool(torch.gather(obs[MASK_KEY], 1, actions.unsqueeze(1)).all())

    head = APPOLearner.policy_head(model, spec)  # what load_policy, enjoy and export run
    assert isinstance(head, Actor) and head.state_layout() == {} and head.initial_state(N) == {}
    with torch.no_grad():
        out = head(obs)
        head_greedy, _, state = head.act(obs, {}, first, greedy=True)
        expected = greedy_actions(out, spec)
        if kind == "box":
            expected = torch.clamp(expected, head.action_low, head.action_high)
        torch.testing.assert_close(head_greedy, expected)
        torch.testing.assert_close(head.actions(obs, sample=False), expected)
        sampled, sampled_logp, _ = head.act(obs, {}, first)
    assert state == {} and sampled.shape == expected.shape
    if kind in ("discrete", "multi_discrete", "dict_masked"):  # nothing clipped: the logp is the drawn action's
        torch.testing.assert_close(sampled_logp, model.distribution(policy_out).log_prob(sampled))
    if kind == "box":
        assert bool((sampled.abs() <= 1.0).all())


@pytest.mark.parametrize("learner", [SACLearner, TD3Learner], ids=["sac", "td3"])
def test_off_policy_actor_acts_through_the_contract_as_before(learner) -> None:
    spec = make_env_spec("Pendulum-v1")
    actor_module = learner.build_policy(spec, Config(env="Pendulum-v1", algo=learner.__name__[:-7].lower()),
                                        torch.device("cpu"))
    obs, first = torch.randn(N, 3), torch.ones(N, dtype=torch.bool)
    actor = published_actor(actor_module)
    assert actor.state_layout() == {} and actor.initial_state(N) == {}
    for warmup in (1.0, 0.0):  # uniform random actions during the warm-up, then the actor's draw
        actor_module.warmup.fill_(warmup)
        torch.manual_seed(5)
        want, want_logp = actor_module.act(obs)
        torch.manual_seed(5)
        actions, logp, state = actor.act(obs, {}, first)
        torch.testing.assert_close(actions, want)
        torch.testing.assert_close(logp, want_logp)
        assert state == {}
    with torch.no_grad():
        greedy, _, _ = actor.act(obs, {}, first, greedy=True)
        torch.testing.assert_close(greedy, actor_module(obs)[0])  # the evaluator's greedy path before
    head = learner.policy_head(actor_module, spec)
    assert isinstance(head, Actor) and head.state_layout() == {}
    with torch.no_grad():
        torch.testing.assert_close(head.act(obs, {}, first, greedy=True)[0], head(obs))
        torch.manual_seed(7)
        sampled = head.act(obs, {}, first)[0]
        torch.manual_seed(7)
        torch.testing.assert_close(sampled, actor_module.explore(obs)[0])


def test_state_helpers_and_slot_layout() -> None:
    layout = {"h": ((5,), np.dtype(np.float32)), "step": ((), np.dtype(np.int64))}
    state = zero_state(layout, 3)
    assert state["h"].shape == (3, 5) and state["h"].dtype == torch.float32 and state["step"].dtype == torch.int64
    assert zero_state({}, 3) == {}
    state = {"h": torch.ones(3, 5)}
    reset = reset_where_first(state, torch.tensor([True, False, True]))
    assert reset["h"].sum(1).tolist() == [0.0, 5.0, 0.0]

    cfg = Config(env="CartPole-v1", workers=2, envs_per_worker=6, worker_splits=2, rollout=4, batch_size=36)
    spec = make_env_spec("CartPole-v1")
    plain = trajectory_layout(cfg, spec)
    s, t, e = num_slots(cfg), cfg.rollout, cfg.envs_per_split
    assert plain["first"] == ((s, t + 1, e), np.dtype(np.bool_))
    assert not any(k.startswith("state/") for k in plain)  # a feed-forward actor: no state columns
    assert trajectory_layout(cfg, spec, {}) == plain and trajectory_bytes(cfg, spec, {}) == trajectory_bytes(cfg, spec)
    with_state = trajectory_layout(cfg, spec, layout)
    assert with_state["state/h"] == ((s, t + 1, e, 5), np.dtype(np.float32))

    traj = allocate_trajectories(cfg, spec, layout)
    rng = np.random.default_rng(0)
    traj["first"][...] = rng.random(traj["first"].shape) < 0.3
    traj["state/h"][...] = rng.standard_normal(traj["state/h"].shape)
    slots = np.array([3, 1])
    batch = gather_batch(traj, slots, 0, torch.device("cpu"))
    assert batch.first.shape == (t + 1, 2 * e) and batch.first.dtype == torch.bool
    for k, slot in enumerate(slots):
        np.testing.assert_array_equal(batch.first[:, k * e:(k + 1) * e].numpy(), traj["first"][slot])
        np.testing.assert_array_equal(batch.initial_state["h"][k * e:(k + 1) * e].numpy(), traj["state/h"][slot, 0])
        np.testing.assert_array_equal(batch.initial_state["step"][k * e:(k + 1) * e].numpy(),
                                      traj["state/step"][slot, 0])
    half = batch.columns(slice(0, e))
    assert half.first.shape == (t + 1, e) and half.initial_state["h"].shape == (e, 5)
    assert gather_batch(allocate_trajectories(cfg, spec), slots, 0, torch.device("cpu")).initial_state == {}


def _serve(channels: Channels, traj, deadline: float) -> tuple[int, int]:
    """The policy worker's part for one request: action 0, and the state after the step written to row t + 1."""
    def write_state(slot: int, t: int) -> None:
        traj["state/h"][slot, t + 1] = traj["state/h"][slot, t] + 1 + np.arange(traj["state/h"].shape[2])[:, None]

    return serve_request(channels, traj, deadline, write_state)


def test_rollout_worker_writes_episode_starts_and_hands_the_state_over() -> None:
    """The real rollout worker on CartPole (always pushing left: episodes of about 10 steps): `first` is set at
    the run's first step and after every episode end, and row T of `first` and of the state starts the next
    slot."""
    cfg = Config(env="CartPole-v1", env_vectorization="loop", workers=1, envs_per_worker=3, worker_splits=1,
                 rollout=24, batch_size=72, minibatches=1)  # one env at a time: an episode start right after its end
    cfg.validate()
    traj = allocate_trajectories(cfg, make_env_spec(cfg.env), {"h": ((2,), np.dtype(np.float32))})
    channels = Channels.create(cfg.workers, num_slots(cfg))
    a, b = 0, 1
    channels.free.put(a)
    proc = mp.get_context("fork").Process(target=run_rollout_worker, args=(0, cfg, traj, channels), daemon=True)
    proc.start()
    try:
        deadline = time.monotonic() + 60
        for t in range(cfg.rollout):
            assert _serve(channels, traj, deadline) == (a, t)
        assert channels.full.get(timeout=30) == a
        first, ended = traj["first"][a].copy(), traj["terminated"][a] | traj["truncated"][a]
        state_last = traj["state/h"][a, -1].copy()
        assert ended.any(axis=0).all()  # every env finished an episode in the slot
        assert first[0].all()  # the run's first step
        np.testing.assert_array_equal(first[1:], ended)
        channels.free.put(b)
        assert _serve(channels, traj, deadline) == (b, 0)
        np.testing.assert_array_equal(traj["first"][b, 0], first[-1])
        np.testing.assert_array_equal(traj["state/h"][b, 0], state_last)
        assert (state_last != 0).all()
    finally:
        channels.request_stop()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
