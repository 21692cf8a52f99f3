"""All hyperparameters and run settings in one dataclass: their defaults, derived settings and validation.

The command line, --config files, the env presets and --scale resolve into a Config in `asyncrl.resolve`.
Importing this module must stay cheap (no torch): every process reads the config. It imports only the
ground floor of the package (`asyncrl.system`, `asyncrl.scaling`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from asyncrl.system import install_hint, local_world_size, usable_cpus


def default_workers() -> int:
    """Twice the cores this process may use (affinity, cgroup quota), shared by the ranks torchrun started on
    this node: rollout workers spend much of their time waiting for actions."""
    return max(2, 2 * usable_cpus() // local_world_size())


def auto_envs_per_worker(cfg: Config) -> int:
    """Envs per worker such that all envs hold about two batches of trajectories in flight.

    The oldest sample of a trajectory is about envs x rollout / batch updates old when the learner sees it,
    so sizing the env count from the batch keeps policy lag near 2 for any worker count. The envs per split
    are a divisor of batch / rollout, so batches are whole trajectories that split into the minibatches.
    """
    per_batch = cfg.batch_size // max(cfg.rollout, 1)
    target = max(1, 2 * per_batch // max(cfg.workers * cfg.worker_splits, 1))
    minibatches = max(cfg.minibatches, 1)
    divisors = [d for d in range(1, per_batch + 1)
                if per_batch % d == 0 and d <= target and (per_batch // d) % minibatches == 0] or [1]
    return max(divisors) * max(cfg.worker_splits, 1)


class ConfigError(ValueError):
    """Bad user input; the CLI prints it as one line and exits with code 2."""


def parse_info_keys(text: str) -> tuple[str, ...]:
    """'a,b' -> ('a', 'b'); '' -> (). A name must be a plain identifier, so that info_<name> reads as a metric."""
    names = tuple(part.strip() for part in text.split(",")) if text.strip() else ()
    for name in names:
        if not name.isidentifier():
            raise ConfigError(f"--info-keys {text!r}: {name!r} is not a key name; give comma-separated names such "
                              f"as 'distance,coins'")
    return names


def parse_env_kwargs(text: str) -> dict[str, Any]:
    """--env-kwargs: a JSON object of env constructor arguments."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--env-kwargs {text!r} is not valid JSON ({exc}); give an object, e.g. "
                          f"'{{\"continuous\": true}}'") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--env-kwargs must be a JSON object of constructor arguments, not {text!r}; e.g. "
                          f"'{{\"continuous\": true}}'")
    return value


LOCKSTEP_ONES = ("workers", "worker_splits", "policy_workers")  # what --deterministic sets to 1
SERIAL_ONES = ("policy_workers",)  # what --serial sets to 1 (its envs keep the --workers x --worker-splits layout)
# The APPO learner applies --normalize-returns and --value-transform (asyncrl/algo/return_norm.py,
# value_transform.py); validate() refuses them where a learner does not.
VALUE_SCALING_IN_LEARNER = True
# Which --algo a flag applies to: a field's metadata "algos" (absent: every algorithm). A flag given on the command
# line, or a config-file value that differs from the preset's, for an algorithm outside it is refused.
ALGOS = ("appo", "sac", "td3", "redq")
PPO_ONLY = ("appo",)
PRECISIONS = ("auto", "fp32", "bf16", "bf16-all")  # --precision
COMPILE_CHOICES = ("none", "inference", "learner", "all")  # --compile: which hot paths torch.compile takes
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")  # --compile-mode: torch.compile's mode
ACTIVATIONS = ("tanh", "relu")  # --activation: the built-in MLPs' hidden units
REPLAY_ONLY = ("sac", "td3", "redq")


def ppo_setting(default: Any, help: str) -> Any:
    """A Config field that only APPO uses: its default and its --help text."""
    return field(default=default, metadata={"algos": PPO_ONLY, "help": help})


def applies_to(f: dataclasses.Field) -> tuple[str, ...]:
    """The --algo values field `f` applies to."""
    return tuple(f.metadata.get("algos", ALGOS))


def check_applicable(algo: str, given: list[str]) -> None:
    """ConfigError (one line) for the first given setting that --algo `algo` does not use."""
    if algo not in ALGOS:
        return  # validate() names the choices; a learner registered at run time (tests) is not checked
    fields = {f.name: f for f in dataclasses.fields(Config)}
    for name in given:
        algos = applies_to(fields[name])
        if algo not in algos:
            raise ConfigError(f"--{name.replace('_', '-')} applies to --algo {', '.join(algos)} only, not {algo}; "
                              f"drop it")


def check_experiment_name(name: str) -> None:
    """An experiment is one directory under --train-dir: "" (the env's name) or a single path component."""
    if not name:
        return
    if not name.strip() or "/" in name or name == "." or ".." in name or "\0" in name:
        raise ConfigError(f"--experiment {name!r} must be a single directory name (no '/', no '..', not '.', not "
                          f"blank); to write elsewhere use --train-dir")


PBT_SETTINGS = ("lr", "entropy_coeff", "clip_ratio", "gamma")  # what --policy-settings sets and PBT perturbs


def policy_settings(cfg: Config) -> list[dict[str, float]]:
    """--policy-settings as one dict per policy ({} each when not given); ConfigError (one line) if malformed."""
    if not cfg.policy_settings.strip():
        return [{} for _ in range(cfg.num_policies)]
    try:
        value = json.loads(cfg.policy_settings)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--policy-settings is not valid JSON ({exc.msg}); give a list of objects, e.g. "
                          f"'[{{\"lr\": 1e-6}}, {{}}]'") from None
    if not isinstance(value, list) or len(value) != cfg.num_policies or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"--policy-settings must be a JSON list of {cfg.num_policies} objects, one per policy "
                          f"(--num-policies {cfg.num_policies})")
    for entry in value:
        for key, v in entry.items():
            if key not in PBT_SETTINGS:
                raise ConfigError(f"--policy-settings sets {key!r}; it takes {', '.join(PBT_SETTINGS)}")
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
                raise ConfigError(f"--policy-settings {key} must be a non-negative number (got {v!r})")
    return [{k: float(v) for k, v in entry.items()} for entry in value]


def member_config(cfg: Config, settings: dict[str, float]) -> Config:
    """One policy's settings: `cfg` with its --policy-settings entry (or PBT's current values) applied."""
    return dataclasses.replace(cfg, **settings) if settings else cfg


def member_settings(cfg: Config) -> dict[str, float]:
    """The settings --policy-settings and PBT can set, as `cfg` has them."""
    return {k: float(getattr(cfg, k)) for k in PBT_SETTINGS}


@dataclass
class Config:
    """One asyncrl run. Field docs double as `--help` text."""

    env: str = field(default="atari_pong", metadata={"help": "atari_<game>, a gymnasium id, null, or module:callable"})
    env_kwargs: str = field(default="{}", metadata={
        "help": "constructor arguments for a gymnasium id (gymnasium.make) or module:callable, as a JSON object, "
                "e.g. '{\"continuous\": true}'"})
    info_keys: str = field(default="", metadata={
        "help": "comma-separated numeric keys of a gymnasium env's step info, recorded at each episode's end as "
                "info_<key> (mean of the last 100 episodes), e.g. 'distance,coins'"})
    env_vectorization: str = field(default="auto", metadata={
        "help": "how a gymnasium id's envs are stepped: auto (as one gymnasium VectorEnv batch where the id has a "
                "vectorised implementation, e.g. CartPole-v1; else one env at a time) or loop (always one env at a "
                "time); a module:callable returning a VectorEnv is always batched"})
    # --- sampling ---
    workers: int = field(default_factory=default_workers, metadata={"help": "rollout worker processes"})
    envs_per_worker: int = field(default=0, metadata={
        "help": "envs each rollout worker steps (0: auto, about 2 batches in flight so policy lag stays ~2)"})
    worker_splits: int = field(default=2, metadata={"help": "groups per worker stepped alternately (double buffering)"})
    policy_workers: int = field(default=1, metadata={"help": "inference processes"})
    rollout: int = field(default=32, metadata={"help": "trajectory length T (agent steps)"})
    env_threads: int = field(default=1, metadata={"help": "C++ threads per Atari vector env"})
    doom_measurements: bool = field(default=False, metadata={
        "help": "Doom: observe {'screen': frame, 'measurements': health, armor, ammo, kills, frags} (a Dict "
                "observation) instead of the frame alone"})
    max_episode_frames: int = field(default=108_000, metadata={
        "help": "Atari: cut a game after this many emulator frames (a truncation: the learner bootstraps from the "
                "last observation, unlike a game over)"})
    # --- learning ---
    algo: str = field(default="appo", metadata={
        "help": "learning algorithm (asyncrl/agents/registry.py): appo, or off-policy sac, td3, redq (Box actions; "
                "docs/off-policy.md)"})
    batch_size: int = field(default=1024, metadata={
        "help": "samples per learner update (not given: the preset's, rounded up to whole trajectories of the envs "
                "per split)"})
    epochs: int = ppo_setting(3, "passes over each batch")
    minibatches: int = ppo_setting(4, "optimizer steps per epoch")
    lr: float = field(default=2.5e-4, metadata={"help": "Adam learning rate"})
    lr_scaling: str = field(default="none", metadata={
        "help": "none, sqrt or linear: use --lr x sqrt(k) or --lr x k as the learning rate, k = global batch "
                "(--batch-size x ranks) / --lr-reference-batch; given neither this nor --lr, APPO uses sqrt once "
                "the global batch exceeds the preset's batch (docs/scaling.md)"})
    lr_reference_batch: int = field(default=1024, metadata={
        "help": "the global batch at which --lr-scaling leaves --lr unchanged (the default sqrt rule, without "
                "--lr-scaling, takes the preset's batch unless this is given)"})
    lr_base: float = field(default=0.0, metadata={
        "help": "with --lr-scaling: the rate it scales, recorded in config.json so --resume does not scale twice "
                "(0: --lr; a given --lr resets it)", "cli": False})
    scale: str = ppo_setting("",
        "small, medium or large: the scaling guide's PPO settings for 64 / 4,096 / 65,536 envs (lr, rollout, "
        "minibatches, epochs, gamma, vtrace-c, workers x envs per worker, batch = envs x rollout); given "
        "flags win over it, it wins over the env's preset")
    lr_schedule: str = ppo_setting("constant",
        "kl (adapts to keep the policy KL near --kl-target), constant, linear (decays to 0 at --frames) "
        "or auto (linear when --frames is set)")
    lr_warmup: int = ppo_setting(0,
        "frames over which the learning rate rises linearly from 0 to what --lr-schedule gives (0: none), "
        "as optax's warm-up schedules do")
    kl_target: float = ppo_setting(0.01,
        "mean KL from the behaviour policy to the current one that the kl schedule aims at")
    adam_eps: float = ppo_setting(1e-5, "Adam epsilon")
    gamma: float = field(default=0.99, metadata={"help": "discount factor"})
    clip_ratio: float = ppo_setting(0.1, "PPO clip epsilon")
    value_coeff: float = ppo_setting(0.5, "value loss weight")
    entropy_coeff: float = ppo_setting(0.01, "entropy bonus weight")
    max_grad_norm: float = ppo_setting(0.5, "gradient norm clip")
    vtrace_rho: float = ppo_setting(1.0,
        "V-trace rho-bar (importance weight clip)")
    vtrace_c: float = ppo_setting(0.95,
        "V-trace c-bar (trace cutting; on-policy it acts like GAE's lambda)")
    normalize_advantages: bool = ppo_setting(True,
        "normalise advantages per minibatch")
    adv_std_floor: float = ppo_setting(0.0,
        "with --normalize-advantages: divide by the advantages' std or this, whichever is larger, so a learned "
        "task's near-zero advantages are not scaled up to unit size (reward units; the vector preset's 1.0 keeps "
        "a solved task solved)")
    normalize_obs: bool = ppo_setting(False,
        "running mean/std observation normalisation, per key of a Dict observation; frames per pixel, in place of "
        "the CNN's / 255 (Sample Factory's normalize_input)")
    normalize_returns: bool = ppo_setting(False,
        "divide rewards by a running RMS of the V-trace targets (PopArt-lite, asyncrl/algo/return_norm.py) "
        "so value targets are of order 1")
    center_values: bool = ppo_setting(False,
        "the value head learns the V-trace targets minus an offset refitted to their mean at every step, "
        "and V-trace reads head + offset (asyncrl/agents/appo/loss.py): no step pulls the network towards "
        "a constant, which on returns far from 0 made an LSTM's cells run away (docs/results.md); on by "
        "default with --rnn lstm")
    value_transform: str = ppo_setting("none",
        "none or symlog: the value head predicts symlog(V) (DreamerV3), V-trace reads symexp(head)")
    max_policy_lag: int = ppo_setting(4,
        "drop samples more than this many updates old")
    clip_reference: str = ppo_setting("acting",
        "what PPO's ratio and clip compare the policy with: acting (the policy that acted, some updates old) or "
        "learner (the learner's policy when the batch's update began, one extra forward pass a batch: decoupled "
        "PPO, Hilton et al. 2021; V-trace's importance weights still correct for the acting policy)")
    hidden_size: int = field(default=64, metadata={"help": "MLP width for vector observations"})
    activation: str = ppo_setting("tanh",
        "hidden units of the MLPs on vector observations: tanh (most PPO baselines for control) or relu "
        "(gymnax-blines' MinAtar agents; on Breakout-MinAtar it learns much faster, docs/results.md)")
    # --- populations: several policies, population-based training (docs/populations.md) ---
    num_policies: int = ppo_setting(1,
        "policies trained at once, each with its own weights, optimiser and version (one learner process "
        "trains them all); --policy-mapping says which acts where")
    policy_mapping: str = ppo_setting("fixed",
        "fixed (a multi-agent env's agent k, or a single-agent env's env column k, is policy k mod "
        "--num-policies) or random (each agent draws a policy at each episode start)")
    policy_settings: str = ppo_setting("",
        "per-policy starting settings, a JSON list with one object per policy, of lr, entropy_coeff, "
        "clip_ratio and gamma, e.g. '[{\"lr\": 1e-6}, {}, {}, {}]' (the flags' values elsewhere)")
    pbt: bool = ppo_setting(False,
        "population-based training over the --num-policies policies: every --pbt-period frames the worst "
        "--pbt-fraction copy the best's weights and settings and perturb them (pbt.jsonl)")
    pbt_period: int = ppo_setting(1_000_000,
        "frames between PBT rounds")
    pbt_fraction: float = ppo_setting(0.25,
        "the share of the population replaced each PBT round (at least one policy), and the share it "
        "copies from")
    pbt_gap: float = ppo_setting(0.1,
        "a PBT copy needs the source's objective to beat the replaced policy's by more than this share of "
        "its magnitude (near-ties are left alone)")
    self_play: bool = ppo_setting(False,
        "a multi-agent env's episodes pit one seat of a learning policy against snapshots of the learning "
        "policies (--self-play-pool, one every --self-play-every versions); the snapshots' steps are not "
        "trained on, the win rate against them is logged")
    self_play_pool: int = ppo_setting(8,
        "snapshots kept as self-play opponents (the oldest is replaced; all start as the initial policy)")
    self_play_every: int = ppo_setting(10,
        "policy versions between self-play snapshots")
    # --- model: encoder and recurrent core (docs/models.md) ---
    encoder: str = ppo_setting("auto",
        "auto (the Nature CNN for images, an MLP for vectors), nature, impala (the IMPALA ResNet), mlp, or "
        "module:callable, a factory(obs_shape, hidden_size) returning a torch.nn.Module")
    rnn: str = ppo_setting("none",
        "recurrent core between the encoder and the heads: none, gru or lstm (the learner backpropagates "
        "through each whole --rollout)")
    rnn_size: int = ppo_setting(512, "units per layer of the --rnn core: about the encoder's width (512 after the "
                                     "Nature CNN; the vector presets set 128, docs/models.md)")
    rnn_layers: int = ppo_setting(1, "layers of the --rnn core")
    # --- off-policy learners (--algo sac, td3, redq; asyncrl/agents/off_policy/learner.py) ---
    replay_size: int = field(default=1_000_000, metadata={"algos": REPLAY_ONLY,
        "help": "sac/td3/redq: replay buffer capacity in transitions (checked against free RAM at start)"})
    learning_starts: int = field(default=5000, metadata={"algos": REPLAY_ONLY,
        "help": "sac/td3/redq: env steps of uniform random actions, and transitions held, before updates start"})
    utd: float = field(default=0.0, metadata={"algos": REPLAY_ONLY,
        "help": "sac/td3/redq: gradient updates per env step (0: the algorithm's, 1 for sac/td3, 20 for redq)"})
    q_divergence_alert: float = field(default=1.0, metadata={"algos": REPLAY_ONLY,
        "help": "sac/td3/redq: warn when the critics' estimates exceed the observed returns by this fraction "
                "(q_divergence) in 3 checks in a row, after 1/((1-gamma) tau) updates (0: never)"})
    sac_batch_size: int = field(default=256, metadata={"algos": REPLAY_ONLY,
        "help": "sac/td3/redq: transitions sampled from the replay buffer per gradient update"})
    tau: float = field(default=0.005, metadata={"algos": REPLAY_ONLY,
        "help": "sac/td3/redq: Polyak rate of the target networks"})
    per: bool = field(default=False, metadata={"algos": REPLAY_ONLY,
        "help": "sac/td3/redq: prioritized replay (proportional, alpha 0.6, beta 0.4 -> 1) instead of uniform"})
    exploration_noise: float = field(default=0.1, metadata={"algos": ("td3",),
        "help": "td3: std of the Gaussian noise added to the deterministic actor's actions, in half action ranges"})
    train: bool = field(default=True, metadata={"help": "learn; --no-train only samples (throughput benchmarks)"})
    # --- run ---
    frames: int = field(default=0, metadata={"help": "stop after this many emulator frames (0: no limit), within a "
                                                 "step of it; the learner first trains on the whole batches already "
                                                 "collected"})
    seconds: float = field(default=0.0, metadata={"help": "stop after this many seconds (0: no limit)"})
    train_dir: str = field(default="train_dir", metadata={"help": "where experiments are written"})
    experiment: str = field(default="", metadata={"help": "experiment name (default: the env name)"})
    device: str = field(default="auto", metadata={"help": "auto, cpu or cuda"})
    precision: str = ppo_setting("auto",
        "compute dtype: auto (bf16 encoder for the CNN on CPUs with native bf16, else fp32), fp32, bf16 (the "
        "encoder), or bf16-all (bf16 autocast over the whole forward; log-probs, values, V-trace and the loss in "
        "fp32; for CUDA, see docs/performance.md)")
    compile: str = field(default="none", metadata={"algos": ("appo", "sac"), "help":
        "torch.compile the hot paths: none, inference (the policy workers' act, padded to fixed batch shapes), "
        "learner (the whole update: forward, loss, backward), or all; compiled artefacts are cached in "
        "$TORCHINDUCTOR_CACHE_DIR (default ~/.cache/asyncrl/inductor); see docs/performance.md"})
    compile_mode: str = field(default="default", metadata={"algos": ("appo", "sac"), "help":
        "torch.compile's mode for --compile: default, reduce-overhead (CUDA graphs, CUDA only) or max-autotune"})
    seed: int = field(default=0, metadata={
        "help": "random seed of the model's initial weights, minibatch order, env resets and action sampling"})
    deterministic: bool = ppo_setting(False,
        "reproducible learning: one rollout worker, one split and one policy worker in lockstep with the "
        "learner, one torch thread, deterministic torch algorithms (see docs/configuration.md)")
    resume: bool = field(default=False, metadata={"help": "continue the experiment from its latest checkpoint"})
    serial: bool = field(default=False, metadata={
        "help": "run env stepping, inference and learning in this one process, with no child process (for "
                "debuggers, and machines that cannot fork; slower; see docs/configuration.md)"})
    learner_threads: int = field(default=0, metadata={"help": "torch threads in the learner (0: auto)"})
    # --- remote actor groups on a Ray cluster (asyncrl/runtime/remote/, docs/ray.md) ---
    ray: str = field(default="", metadata={
        "help": "a Ray cluster's address (HOST:PORT of its head, as `ray start --head` prints it) to run "
                "--remote-workers actor groups on; needs the ray extra"})
    remote_workers: int = field(default=0, metadata={
        "help": "actor groups on the --ray cluster, each stepping and acting on its own node and shipping whole "
                "trajectories to this machine's learner (0: none; --workers 0 leaves all sampling to them)"})
    remote_envs_per_worker: int = field(default=0, metadata={
        "help": "envs each remote actor group steps, in splits of --envs-per-worker / --worker-splits envs "
                "(0: as --envs-per-worker)"})
    remote_cpus: float = field(default=1.0, metadata={
        "help": "the Ray CPU resource each remote actor group asks for (Ray places groups where it is free)"})
    policy_nice: int = field(default=5, metadata={
        "help": "niceness added to policy workers: the learner gets contended cores first (0: off)"})
    rollout_nice: int = field(default=10, metadata={
        "help": "niceness added to rollout workers: the learner, then the policy workers, go first (0: off)"})
    report_interval: float = field(default=5.0, metadata={"help": "seconds between progress reports"})
    dashboard: bool = field(default=True, metadata={
        "help": "a live dashboard (steps/s, stage shares and verdict, lag, queues, CPU and memory per process kind, "
                "losses, return, ETA) instead of the progress line when stdout is a terminal; never in logs or pipes"})
    checkpoint_interval: float = field(default=300.0, metadata={"help": "seconds between checkpoints"})
    hang_timeout: float = field(default=30.0, metadata={
        "help": "seconds a process may go without progress before it is restarted (the learner: run stopped)"})
    keep_checkpoints: int = field(default=3, metadata={"help": "checkpoints kept on disk"})
    dist_timeout: float = field(default=15.0, metadata={  # data-parallel (torchrun), asyncrl/runtime/distributed/
        "help": "under torchrun: seconds a learner waits for the other ranks in a collective before the group stops"})
    max_env_error_rate: float = field(default=0.01, metadata={
        "help": "stop the run when env instances raise in more than this share of env steps over a minute "
                "(a failing env instance is recreated and its step left out of training)"})
    # --- evaluation and logging ---
    eval_every: int = field(default=0, metadata={
        "help": "evaluate the latest weights every this many frames in a separate low-priority process (0: off)"})
    eval_episodes: int = field(default=5, metadata={
        "help": "episodes per evaluation, played both greedily and with sampled actions"})
    eval_video: bool = field(default=False, metadata={
        "help": "record one greedy episode per evaluation to videos/eval_<frames>.mp4"})
    wandb: bool = field(default=False, metadata={"help": "also log to Weights & Biases (WANDB_MODE=offline works)"})
    wandb_project: str = field(default="asyncrl", metadata={"help": "W&B project"})
    wandb_entity: str = field(default="", metadata={"help": "W&B entity (team or user; default: yours)"})
    wandb_group: str = field(default="", metadata={"help": "W&B group"})
    wandb_tags: str = field(default="", metadata={"help": "W&B tags, comma-separated"})

    # ----- derived -----
    @property
    def experiment_name(self) -> str:
        return self.experiment or self.env.replace(":", "_").replace("/", "_")

    @property
    def run_dir(self) -> str:
        return os.path.join(self.train_dir, self.experiment_name)

    @property
    def envs_per_split(self) -> int:
        return self.envs_per_worker // self.worker_splits

    @property
    def acting_policies(self) -> int:
        """The models the policy workers act with: the learning policies, and with --self-play the snapshot pool
        (policy ids num_policies .. num_policies + self_play_pool - 1)."""
        return self.num_policies + (self.self_play_pool if self.self_play else 0)

    @property
    def num_splits(self) -> int:
        return self.workers * self.worker_splits

    @property
    def trajectories_per_batch(self) -> int:
        return self.batch_size // (self.rollout * self.envs_per_split)

    def resolve(self) -> Config:
        """Fill in automatic settings (in place) and return self.

        With --lr-scaling the learning rate is `lr_base` (0: the current lr) scaled by the global batch, and
        `lr_base` keeps the base, so resolving a resolved config, or a resumed run's, scales nothing twice.
        Without, lr_base is 0 (and a base recorded by a scaled run becomes the lr again).
        """
        from asyncrl.scaling import LR_RULES, lr_factor, world_size

        base = self.lr_base if self.lr_base > 0 else self.lr
        if self.lr_scaling == "none":
            self.lr, self.lr_base = base, 0.0
        elif self.lr_scaling in LR_RULES and self.lr_reference_batch > 0:
            self.lr_base = base
            self.lr = base * lr_factor(self.lr_scaling, self.batch_size * world_size(), self.lr_reference_batch)
        if self.lr_schedule == "auto":
            self.lr_schedule = "linear" if self.frames else "constant"
        if self.envs_per_worker == 0:
            self.envs_per_worker = auto_envs_per_worker(self)
        return self

    @property
    def info_key_names(self) -> tuple[str, ...]:
        """--info-keys as a tuple of names (ConfigError for an empty or malformed name)."""
        return parse_info_keys(self.info_keys)

    @property
    def env_kwargs_dict(self) -> dict[str, Any]:
        """--env-kwargs parsed (ConfigError if it is not a JSON object)."""
        return parse_env_kwargs(self.env_kwargs)

    def validate(self) -> None:
        """Raise ConfigError with a one-line fix for any impossible setting."""
        check_experiment_name(self.experiment)
        parse_env_kwargs(self.env_kwargs)
        parse_info_keys(self.info_keys)
        if self.deterministic:
            for name in LOCKSTEP_ONES:
                if getattr(self, name) != 1:
                    raise ConfigError(f"--deterministic runs one rollout worker, split and policy worker; drop "
                                      f"--{name.replace('_', '-')} {getattr(self, name)}")
        if self.serial:
            self._validate_serial()
        self._validate_remote()
        for name in ("workers", "envs_per_worker", "worker_splits", "policy_workers", "batch_size", "epochs",
                     "minibatches", "env_threads", "keep_checkpoints", "rnn_size", "rnn_layers", "hidden_size"):
            if getattr(self, name) < (0 if name == "workers" and self.remote_workers else 1):
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if not 0 <= self.seed < 2**31:  # numpy, torch and the envs take it (plus worker offsets) as a seed
            raise ConfigError(f"--seed must be in 0..{2**31 - 1} (got {self.seed})")
        for name in ("frames", "seconds", "learner_threads", "max_policy_lag", "lr_warmup", "adv_std_floor"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must not be negative (got {getattr(self, name)})")
        for name in ("lr", "kl_target", "report_interval", "checkpoint_interval", "adam_eps", "max_grad_norm",
                     "hang_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive (got {getattr(self, name)})")
        for name in ("policy_nice", "rollout_nice"):
            if not 0 <= getattr(self, name) <= 19:
                raise ConfigError(f"--{name.replace('_', '-')} must be in 0..19 (got {getattr(self, name)})")
        if not 0.0 <= self.max_env_error_rate <= 1.0:
            raise ConfigError(f"--max-env-error-rate must be in [0, 1] (got {self.max_env_error_rate})")
        self._validate_off_policy()
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"--gamma must be in [0, 1] (got {self.gamma})")
        if self.rollout < 2:
            raise ConfigError(f"--rollout must be at least 2 (got {self.rollout})")
        if self.envs_per_worker % self.worker_splits:
            raise ConfigError(
                f"--envs-per-worker {self.envs_per_worker} does not divide into --worker-splits "
                f"{self.worker_splits}; use a multiple of {self.worker_splits}")
        if self.remote_envs_per_worker % self.envs_per_split:
            raise ConfigError(f"--remote-envs-per-worker {self.remote_envs_per_worker} must be a multiple of the "
                              f"{self.envs_per_split} envs of a split (--envs-per-worker / --worker-splits): remote "
                              f"trajectories fill the same slots as local ones")
        chunk = self.rollout * self.envs_per_split
        if self.batch_size % chunk:
            good = max(chunk, round(self.batch_size / chunk) * chunk)
            raise ConfigError(
                f"--batch-size {self.batch_size} must be a multiple of rollout x envs per split = {chunk} "
                f"(each trajectory holds {chunk} samples); try --batch-size {good}")
        columns = self.trajectories_per_batch * self.envs_per_split  # a minibatch is a set of whole env columns
        if columns % self.minibatches:
            raise ConfigError(
                f"--minibatches {self.minibatches} must divide the {columns} env columns of a batch "
                f"({self.trajectories_per_batch} trajectories x {self.envs_per_split} envs)")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"--device must be auto, cpu or cuda (got {self.device!r})")
        if self.env_vectorization not in ("auto", "loop"):
            raise ConfigError(f"--env-vectorization must be auto or loop, got {self.env_vectorization!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"--precision must be auto, fp32, bf16 or bf16-all (got {self.precision!r})")
        self._validate_compile()
        if self.lr_schedule not in ("kl", "constant", "linear", "auto"):
            raise ConfigError(f"--lr-schedule must be kl, constant, linear or auto (got {self.lr_schedule!r})")
        if self.lr_schedule == "linear" and not self.frames:
            raise ConfigError("--lr-schedule linear needs --frames to know where the schedule ends")
        self._validate_around_run()
        self._validate_scaling()
        self._validate_population()

    def _validate_compile(self) -> None:
        """--compile and --compile-mode: known values, and the combinations the compiled paths cover."""
        if self.compile not in COMPILE_CHOICES:
            raise ConfigError(f"--compile must be one of {', '.join(COMPILE_CHOICES)} (got {self.compile!r})")
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(f"--compile-mode must be one of {', '.join(COMPILE_MODES)} (got {self.compile_mode!r})")
        if self.compile == "none":
            return
        if self.algo not in ("appo", "sac"):
            raise ConfigError(f"--compile covers appo and sac; --algo {self.algo} runs eager (drop --compile)")
        if self.algo == "sac" and self.compile == "inference":
            raise ConfigError("--compile inference: sac compiles its updates only (its actor acts for a few envs); "
                              "use --compile learner")
        if self.compile_mode == "reduce-overhead" and self.device == "cpu":
            raise ConfigError("--compile-mode reduce-overhead captures CUDA graphs; it needs --device cuda")
        if self.encoder not in ("auto", "nature", "impala", "mlp"):
            raise ConfigError(f"--compile does not cover a user's --encoder {self.encoder}; drop --compile")

    def _validate_population(self) -> None:
        """--num-policies, --policy-mapping, --policy-settings and --pbt."""
        if self.num_policies < 1:
            raise ConfigError(f"--num-policies must be at least 1 (got {self.num_policies})")
        if self.policy_mapping not in ("fixed", "random"):
            raise ConfigError(f"--policy-mapping must be fixed or random (got {self.policy_mapping!r})")
        policy_settings(self)
        if self.num_policies > 1 and self.serial:
            raise ConfigError("--serial trains one policy; drop --num-policies or --serial")
        if self.num_policies > 1 or self.self_play:
            from asyncrl.scaling import world_size

            if world_size() > 1:
                raise ConfigError(f"--num-policies trains its population in one learner process; torchrun started "
                                  f"{world_size()} ranks: launch asyncrl-train without torchrun")
        if self.num_policies > 1 and self.deterministic:
            raise ConfigError("--deterministic trains one policy; drop --num-policies or --deterministic")
        if self.pbt and self.num_policies < 2:
            raise ConfigError(f"--pbt needs a population: set --num-policies 2 or more (got {self.num_policies})")
        if self.pbt_period < 1:
            raise ConfigError(f"--pbt-period must be at least 1 frame (got {self.pbt_period})")
        if not 0.0 < self.pbt_fraction <= 0.5:
            raise ConfigError(f"--pbt-fraction must be in (0, 0.5] (got {self.pbt_fraction})")
        if self.pbt_gap < 0:
            raise ConfigError(f"--pbt-gap must not be negative (got {self.pbt_gap})")
        for name in ("self_play_pool", "self_play_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if self.self_play and (self.serial or self.deterministic):
            raise ConfigError("--self-play needs the forked engine's policy workers; drop --serial/--deterministic")

    def _validate_remote(self) -> None:
        """--ray and --remote-workers: both or neither, in the forked engine of one learner."""
        if self.remote_workers < 0:
            raise ConfigError(f"--remote-workers must not be negative (got {self.remote_workers})")
        if self.remote_envs_per_worker < 0:
            raise ConfigError(f"--remote-envs-per-worker must not be negative (got {self.remote_envs_per_worker})")
        if not self.remote_cpus > 0:
            raise ConfigError(f"--remote-cpus must be positive (got {self.remote_cpus})")
        if not self.remote_workers:
            if self.ray:
                raise ConfigError("--ray places --remote-workers actor groups on the cluster; add --remote-workers N")
            return
        if not self.ray:
            raise ConfigError("--remote-workers runs actor groups on a Ray cluster; add --ray HOST:PORT (the "
                              "address `ray start --head` printed)")
        for flag, on in (("--serial", self.serial), ("--deterministic", self.deterministic)):
            if on:
                raise ConfigError(f"--remote-workers feeds the forked engine's learner; drop {flag} or "
                                  f"--remote-workers")
        from asyncrl.scaling import world_size

        if world_size() > 1:
            raise ConfigError(f"--remote-workers feeds one learner; torchrun started {world_size()} ranks: launch "
                              f"asyncrl-train without torchrun")
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ConfigError("--ray needs the ray package: " + install_hint("ray"))

    @property
    def remote_envs(self) -> int:
        """Envs per remote actor group."""
        return self.remote_envs_per_worker or self.envs_per_worker

    @property
    def remote_splits(self) -> int:
        """Env splits (and so slots filled together) per remote actor group."""
        return self.remote_envs // self.envs_per_split

    def _validate_serial(self) -> None:
        """--serial runs everything in this process: one inference path, and no torchrun group."""
        from asyncrl.scaling import world_size

        if world_size() > 1:
            raise ConfigError(f"--serial runs in one process, but torchrun started {world_size()} ranks; launch "
                              f"asyncrl-train without torchrun, or drop --serial")
        for name in SERIAL_ONES:
            if getattr(self, name) != 1:
                raise ConfigError(f"--serial acts in its one process (no policy worker processes); drop "
                                  f"--{name.replace('_', '-')} {getattr(self, name)}")

    def _validate_around_run(self) -> None:
        """Evaluation, eval videos and W&B: flag values and the optional packages they need."""
        import importlib.util

        if self.eval_every < 0:
            raise ConfigError(f"--eval-every must not be negative (got {self.eval_every}); 0 turns evaluation off")
        if self.eval_episodes < 1:
            raise ConfigError(f"--eval-episodes must be at least 1 (got {self.eval_episodes})")
        if self.eval_video and not self.eval_every:
            raise ConfigError("--eval-video records evaluation episodes; add --eval-every FRAMES")
        if self.eval_video and not all(importlib.util.find_spec(m) for m in ("imageio", "imageio_ffmpeg", "PIL")):
            raise ConfigError("--eval-video needs imageio, imageio-ffmpeg and pillow: " + install_hint("video"))
        if self.wandb and importlib.util.find_spec("wandb") is None:
            raise ConfigError("--wandb needs the wandb package: " + install_hint("wandb"))

    def _validate_scaling(self) -> None:
        from asyncrl.scaling import LR_RULES, SCALES

        if self.scale and self.scale not in SCALES:
            raise ConfigError(f"--scale must be small, medium or large (got {self.scale!r})")
        if self.lr_scaling not in LR_RULES:
            raise ConfigError(f"--lr-scaling must be none, sqrt or linear (got {self.lr_scaling!r})")
        if self.lr_reference_batch < 1:
            raise ConfigError(f"--lr-reference-batch must be at least 1 (got {self.lr_reference_batch})")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"--activation must be {' or '.join(ACTIVATIONS)} (got {self.activation!r})")
        if self.clip_reference not in ("acting", "learner"):
            raise ConfigError(f"--clip-reference must be acting or learner (got {self.clip_reference!r})")
        if self.value_transform not in ("none", "symlog"):
            raise ConfigError(f"--value-transform must be none or symlog (got {self.value_transform!r})")
        if not VALUE_SCALING_IN_LEARNER and (self.normalize_returns or self.value_transform != "none"):
            raise ConfigError("--normalize-returns and --value-transform are not applied by this version's learner "
                              "yet; leave them out")

    def _validate_off_policy(self) -> None:
        for name in ("replay_size", "sac_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        for name in ("learning_starts", "utd", "exploration_noise", "q_divergence_alert"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must not be negative (got {getattr(self, name)})")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"--tau must be in (0, 1] (got {self.tau})")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Config:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
