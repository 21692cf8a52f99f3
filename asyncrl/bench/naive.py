"""`naive`: the baseline most users start from, written carefully.

gymnasium's `AsyncVectorEnv` (shared memory, one process per env, same-step auto-reset) feeds one synchronous
loop: collect `rollout` x `num_envs` steps with batched inference under `torch.inference_mode`, compute GAE,
then run `epochs` x `minibatches` PPO updates on the batch, with the same model, losses and optimizer settings
as asyncrl. The env processes sit idle while the policy runs, so torch may use every core; as a careful user
would, the loop times 1 thread against all cores for inference and for training during warm-up and keeps the
faster of each (small inference batches often run faster on one thread, and so does anything on a busy machine).
Atari uses gymnasium's ALE envs with the standard wrappers. The model runs on the bench's `--device` (as
asyncrl's rows do); the rollout storage stays on the CPU and each step's observations and each minibatch are
copied to the device, as asyncrl's policy workers and learner copy theirs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np

from asyncrl.bench.machine import tree_cpu_seconds, usable_cpus
from asyncrl.bench.settings import BenchSettings
from asyncrl.bench.windows import make_record
from asyncrl.config import Config
from asyncrl.envs.base import EnvError, EnvSpec

ATARI_PREFIX = "atari_"


def atari_id(env: str) -> str:
    """`atari_space_invaders` -> `ALE/SpaceInvaders-v5`."""
    return "ALE/" + "".join(part.capitalize() for part in env[len(ATARI_PREFIX):].split("_")) + "-v5"


def make_atari(env_id: str) -> gym.Env:
    import ale_py

    try:
        import cv2  # noqa: F401 - AtariPreprocessing resizes with OpenCV
    except ImportError:
        raise EnvError('naive Atari needs OpenCV: pip install -e ".[bench]" (opencv-python-headless)') from None

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner on stdout, which carries the record
    gym.register_envs(ale_py)
    env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0)
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, noop_max=30, terminal_on_life_loss=False)
    return gym.wrappers.FrameStackObservation(env, 4)


def env_factory(env: str) -> tuple[Callable[[], gym.Env], int]:
    """A factory for one env, and its frameskip; gymnasium ids and atari_<game> only."""
    if env.startswith(ATARI_PREFIX):
        env_id = atari_id(env)
        return (lambda: make_atari(env_id)), 4
    if env in gym.registry:
        return (lambda: gym.make(env)), 1
    raise EnvError(f"naive mode runs gymnasium ids and atari_<game>, not {env!r}")


def make_envs(env: str, num_envs: int, batched: bool = False) -> tuple[gym.vector.VectorEnv, EnvSpec]:
    """AsyncVectorEnv of `num_envs` processes, or (`batched`) the id's own VectorEnv in this process."""
    factory, frameskip = env_factory(env)
    if batched:
        spec = gym.registry.get(env)
        if spec is None or spec.vector_entry_point is None:
            raise EnvError(f"naive_vector runs gymnasium ids with a vectorised implementation, not {env!r}")
        envs: gym.vector.VectorEnv = gym.make_vec(env, num_envs=num_envs, vectorization_mode="vector_entry_point")
    else:
        envs = gym.vector.AsyncVectorEnv([factory] * num_envs, shared_memory=True,
                                         autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    if not isinstance(act_space, gym.spaces.Discrete):
        envs.close()
        raise EnvError(f"naive mode needs a Discrete action space; {env!r} has {act_space}")
    dtype = np.dtype(np.uint8) if obs_space.dtype == np.uint8 else np.dtype(np.float32)
    return envs, EnvSpec(env, tuple(obs_space.shape), dtype, act_space, frameskip)


class NaivePPO:
    """Synchronous PPO: `iterate()` collects one batch, then trains on it. Stage times accumulate."""

    def __init__(self, envs: gym.vector.VectorEnv, spec: EnvSpec, s: BenchSettings, seed: int = 0,
                 gae_lambda: float = 0.95):
        import torch

        from asyncrl.agents.eager import Adam
        from asyncrl.bench.machine import resolve_bench_device
        from asyncrl.models.actor_critic import build_model
        from asyncrl.runtime.host.devices import configure_cuda_backends, resolve_precision

        self.torch, self.envs, self.spec, self.s = torch, envs, spec, s
        self.device = torch.device(resolve_bench_device(s.device))
        configure_cuda_backends(self.device)
        self.cfg = Config(env=s.env, batch_size=s.batch_size, minibatches=s.minibatches, epochs=s.epochs)
        self.gae_lambda = gae_lambda
        self.n = envs.num_envs
        if s.batch_size % self.n or (s.batch_size // self.n) < 2:
            raise ValueError(f"--batch-size {s.batch_size} must be a multiple of the {self.n} envs")
        self.t = s.batch_size // self.n
        if s.batch_size % s.minibatches:
            raise ValueError(f"--minibatches {s.minibatches} must divide --batch-size {s.batch_size}")
        torch.manual_seed(seed)
        self.model = build_model(spec, s.hidden_size).to(self.device)
        image = len(spec.obs_shape) == 3  # the same numerics as asyncrl: NHWC convolutions, bf16 where it pays
        if image:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.model.compute_dtype = resolve_precision("auto", self.device, image)
        self.optimizer = Adam(self.model.parameters(), lr=self.cfg.lr, eps=self.cfg.adam_eps)
        self.clip_rewards = spec.frameskip > 1  # Atari: train on the sign of the reward
        dtype = torch.uint8 if spec.obs_dtype == np.uint8 else torch.float32
        self.obs = torch.zeros((self.t + 1, self.n, *spec.obs_shape), dtype=dtype)
        self.actions = torch.zeros((self.t, self.n), dtype=torch.int64)
        self.logp = torch.zeros((self.t, self.n))
        self.values = torch.zeros((self.t + 1, self.n))
        self.rewards = torch.zeros((self.t, self.n))
        self.dones = torch.zeros((self.t, self.n))
        obs, _ = envs.reset(seed=seed)
        self.obs[0].copy_(torch.from_numpy(obs))
        self.times = {"env": 0.0, "inference": 0.0, "training": 0.0}
        self.threads = {"inference": 1, "training": 1}

    def tune_threads(self, candidates: list[int]) -> dict[str, int]:
        """Pick the faster torch thread count for inference and for training (a warm-up step)."""
        torch, model = self.torch, self.model
        mb = self.obs[:-1].reshape(-1, *self.spec.obs_shape)[: self.s.batch_size // self.s.minibatches]
        mb = mb.to(self.device)

        def infer() -> None:
            with torch.inference_mode():
                model(self.obs[0].to(self.device))[0].cpu()  # .cpu(): waits for a GPU, as acting does

        def train() -> None:
            policy_out, values = model(mb)
            (policy_out.sum() + values.sum()).backward()
            model.zero_grad(set_to_none=True)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        for stage, fn, reps in (("inference", infer, 20), ("training", train, 2)):
            self.threads[stage] = min(candidates, key=lambda n: _time_per_call(torch, n, fn, reps))
        return self.threads

    def iterate(self) -> int:
        """One collect-then-train iteration; returns the agent steps collected."""
        self._collect()
        t0 = time.monotonic()
        self._train()
        self.times["training"] += time.monotonic() - t0
        self.obs[0].copy_(self.obs[self.t])
        return self.t * self.n

    def _collect(self) -> None:
        torch, model, times = self.torch, self.model, self.times
        torch.set_num_threads(self.threads["inference"])
        with torch.inference_mode():
            for t in range(self.t):
                t0 = time.monotonic()
                logits, value = model(self.obs[t].to(self.device))
                logp_all = torch.log_softmax(logits, dim=-1)
                action = (logp_all - torch.empty_like(logp_all).exponential_().log_()).argmax(dim=-1)  # Gumbel
                logp = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
                action = action.cpu()
                self.actions[t] = action
                self.logp[t] = logp.cpu()
                self.values[t] = value.cpu()
                t1 = time.monotonic()
                obs, reward, terminated, truncated, _ = self.envs.step(action.numpy())
                self.obs[t + 1].copy_(torch.from_numpy(obs))
                self.rewards[t].copy_(torch.from_numpy(np.sign(reward) if self.clip_rewards else reward))
                self.dones[t].copy_(torch.from_numpy(terminated | truncated))
                t2 = time.monotonic()
                times["inference"] += t1 - t0
                times["env"] += t2 - t1
            t0 = time.monotonic()
            self.values[self.t] = model(self.obs[self.t].to(self.device))[1].cpu()
            times["inference"] += time.monotonic() - t0

    def _advantages(self):
        """GAE(lambda) over the rollout; returns (advantages, returns), each [T, N]."""
        torch, gamma, lam = self.torch, self.cfg.gamma, self.gae_lambda
        adv = torch.zeros_like(self.rewards)
        last = torch.zeros(self.n)
        for t in reversed(range(self.t)):
            nonterminal = 1.0 - self.dones[t]
            delta = self.rewards[t] + gamma * self.values[t + 1] * nonterminal - self.values[t]
            last = delta + gamma * lam * nonterminal * last
            adv[t] = last
        return adv, adv + self.values[:-1]

    def _train(self) -> None:
        from asyncrl.algo.losses import clipped_surrogate_loss, entropy_bonus, normalize_advantages, value_loss

        torch, cfg, model = self.torch, self.cfg, self.model
        torch.set_num_threads(self.threads["training"])
        adv, returns = self._advantages()
        b, dev = self.t * self.n, self.device
        obs = self.obs[:-1].reshape(b, *self.spec.obs_shape).to(dev)
        actions, old_logp = self.actions.reshape(b).to(dev), self.logp.reshape(b).to(dev)
        adv, returns = adv.reshape(b).to(dev), returns.reshape(b).to(dev)
        size = b // cfg.minibatches
        for _ in range(cfg.epochs):
            perm = torch.randperm(b, device=dev)
            for start in range(0, b, size):
                idx = perm[start:start + size]
                logits, values = model(obs[idx])
                dist = model.distribution(logits)
                logp = dist.log_prob(actions[idx])
                mb_adv = normalize_advantages(adv[idx]) if cfg.normalize_advantages else adv[idx]
                loss = (clipped_surrogate_loss(logp, old_logp[idx], mb_adv, cfg.clip_ratio)
                        + cfg.value_coeff * value_loss(values, returns[idx])
                        - cfg.entropy_coeff * entropy_bonus(dist.entropy()))
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                self.optimizer.step()

    def stage_fractions(self) -> dict[str, float]:
        total = sum(self.times.values()) or 1.0
        return {f"{k}_frac": v / total for k, v in self.times.items()}


def _time_per_call(torch, threads: int, fn: Callable[[], None], reps: int) -> float:
    torch.set_num_threads(threads)
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def timed_windows(step: Callable[[], int], window_s: float, count: int) -> list[float]:
    """Steps/s over `count` consecutive windows, each made of whole iterations lasting at least `window_s`."""
    rates = []
    for _ in range(count):
        steps, t0 = 0, time.monotonic()
        while True:
            steps += step()
            elapsed = time.monotonic() - t0
            if elapsed >= window_s:
                break
        rates.append(steps / elapsed)
    return rates


def run_naive(s: BenchSettings, seed: int = 0) -> dict[str, Any]:
    # Fork the env processes before torch starts its threads (naive_vector: one VectorEnv, no processes).
    envs, spec = make_envs(s.env, s.workers, batched=s.mode == "naive_vector")
    try:
        ppo = NaivePPO(envs, spec, s, seed)
        threads = ppo.tune_threads(sorted({1, usable_cpus()}))
        timed_windows(ppo.iterate, s.window_s, 1)  # warm-up
        ppo.times = dict.fromkeys(ppo.times, 0.0)
        cpu0, t0 = tree_cpu_seconds(), time.monotonic()
        rates = timed_windows(ppo.iterate, s.window_s, s.repeats)
        cpu_run = 100.0 * (tree_cpu_seconds() - cpu0) / ((time.monotonic() - t0) * usable_cpus())
        stages = ppo.stage_fractions()
    finally:
        envs.close()
    return make_record(replace(s, rollout=ppo.t), rates, spec.frameskip, envs_per_worker=1,
                       stages={**stages, "cpu_run": cpu_run},
                       limited_by=max(stages, key=lambda k: stages[k]).removesuffix("_frac"),
                       num_envs=s.workers, torch_threads=threads)
