"""What one benchmark measurement runs: env, mode, worker layout, timing windows."""

from __future__ import annotations

from dataclasses import dataclass, replace

MODES: dict[str, str] = {
    "env_only": "the env backend stepping random actions, no policy: one process per sampler worker, each "
                "stepping VecEnvs the size of a worker split (the ceiling for sampling)",
    "sampler": "rollout + policy workers, no learning (asyncrl-train --no-train)",
    "train": "the whole trainer, learning on (asyncrl-train)",
    "null": "sampler mode on the zero-cost `null` env with a small MLP: the framework's own overhead, "
            "reported as microseconds per agent step per core",
    "naive": "the usual baseline: gymnasium AsyncVectorEnv (shared memory, one process per env) and one "
             "synchronous collect-then-train PPO loop with the same model, batch and minibatches",
    "naive_vector": "the naive loop on the env's own batched implementation (gymnasium's vector_entry_point, one "
                    "process, numpy-batched; CleanRL's shape at thousands of envs), --workers envs in one VectorEnv",
    "replay": "replay-buffer insert and sample transitions/s at --replay-capacity (default 1M), uniform and "
              "prioritized, Pendulum-like (3 float32) and Atari-like (84x84 uint8) observations, and the time "
              "of one prioritized-replay update of 256 priorities (in this process; --env is ignored)",
    "ray_train": "train with as many remote actor groups as --workers (same envs each) on a Ray node started on "
                 "this machine (loopback): half the trajectories through Ray, and the bytes and slots per second "
                 "that went through it",
    "sf2_train": "Sample Factory 2 training a doom_ env with the same layout, from the interpreter --sf2-python "
                 "points at (its own virtual environment): its env frames/s from its own log",
}
TRAINER_MODES = ("sampler", "train", "null", "ray_train")

# The reference layout (also Sample Factory's Atari benchmark layout, with 16 envs per worker).
REF_WORKERS = 4
REF_ENVS_PER_WORKER = 16
REF_ROLLOUT = 32
REF_BATCH = 1024
NULL_WIDE_ENVS_PER_WORKER = 64  # the null env's second layout: 32 envs per request amortise per-message costs
NAIVE_ENVS = 8  # AsyncVectorEnv processes for the naive loop (rollout = batch / envs)
# The batched rows: CartPole-v1 through its VectorEnv at the scaling guide's 4,096 envs (2 workers x 2 splits of
# 1,024), one rollout of 16 steps of every env a batch; the naive loop steps the same 4,096 envs in one VectorEnv.
BATCHED_ENV = "CartPole-v1"
BATCHED_LAYOUT = {"workers": 2, "envs_per_worker": 2048, "rollout": 16, "batch_size": 65536, "minibatches": 4}
BATCHED_ENVS = 4096
REPLAY_CAPACITY = 1_000_000
REPLAY_FILL_GIB = 1.0  # memory each replay buffer may touch when first filled (the capacity stays)
REPLAY_SECONDS = 5.0  # replay mode alone: measured seconds per figure (10 figures)


@dataclass(frozen=True)
class BenchSettings:
    """One measurement. `seconds` of measured time is split into `repeats` windows after one warm-up window."""

    env: str = "atari_pong"
    mode: str = "sampler"
    workers: int = REF_WORKERS  # naive: AsyncVectorEnv processes (one env each)
    envs_per_worker: int = REF_ENVS_PER_WORKER
    worker_splits: int = 2
    rollout: int = REF_ROLLOUT
    batch_size: int = REF_BATCH
    minibatches: int = 4  # asyncrl's default: 4 optimizer steps of 256 samples per 1024-sample batch
    epochs: int = 1
    hidden_size: int = 64
    seconds: float = 15.0
    repeats: int = 3
    extra_trainer_args: tuple[str, ...] = ()  # more asyncrl-train flags (sampler, train and null only)
    replay_capacity: int = REPLAY_CAPACITY  # replay mode only
    replay_fill_gib: float = REPLAY_FILL_GIB  # replay mode only
    sf2_python: str = ""  # sf2_train mode only: a Python with sample-factory and vizdoom installed
    device: str = "auto"  # where the models run, for asyncrl, the naive loop and Sample Factory alike

    @property
    def window_s(self) -> float:
        return self.seconds / self.repeats

    @property
    def envs_per_split(self) -> int:
        return max(1, self.envs_per_worker // self.worker_splits)

    def for_mode(self, mode: str, **changes) -> BenchSettings:
        """A copy for another mode; `null` always runs the null env, `replay` no env."""
        env = mode if mode in ("null", "replay") else changes.pop("env", self.env)
        return replace(self, mode=mode, env=env, **changes)

    @property
    def trainer_device(self) -> str:
        """The `--device` asyncrl-train gets: the last one after `--`, else `device`."""
        extra = list(self.extra_trainer_args)
        flags = [extra[i + 1] for i, a in enumerate(extra[:-1]) if a == "--device"]
        flags += [a.split("=", 1)[1] for a in extra if a.startswith("--device=")]
        return flags[-1] if flags else self.device

    def trainer_args(self) -> list[str]:
        """`asyncrl-train` flags for this layout (sampler, null and train modes)."""
        args = [
            "--env", self.env, "--workers", str(self.workers), "--envs-per-worker", str(self.envs_per_worker),
            "--worker-splits", str(self.worker_splits), "--rollout", str(self.rollout),
            "--batch-size", str(self.batch_size), "--minibatches", str(self.minibatches),
            "--epochs", str(self.epochs), "--hidden-size", str(self.hidden_size), "--device", self.device,
        ]
        return [*args, "--train" if self.mode == "train" else "--no-train", *self.extra_trainer_args]
