"""Which stage limits throughput: a pure function of one report interval's stage-time fractions.

The pipeline is env stepping (rollout workers) -> inference (policy workers) -> transfer (queues, copies)
-> training (learner). The stage that limits it is the one that is busy while the others wait for it:

* the learner is busy almost all the time (it never waits for data)          -> training-bound
  (unless copying batches out of shared memory is most of its busy time)      -> transfer-bound
* otherwise the busiest of env stepping and inference, if it is busy enough   -> env- / inference-bound
* nobody is busy most of the time (rollout workers wait for actions, policy
  workers wait for requests, the learner waits for trajectories)              -> transfer-bound: the time
  goes into handing messages between processes
  (unless the workers wait in the CPU run queue while other jobs hold the
  cores: each hand-over then waits for a core, not for a peer)                -> CPU-starved

A stage timer cannot tell waiting for a peer from waiting for a core: a niced worker on a busy machine books its
run-queue delay as waiting for actions or requests. The workers therefore report that delay (`*_runq_frac`, from
the kernel's schedstat), and starvation is a verdict of its own rather than a transfer-bound misreading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KINDS = ("env", "transfer", "inference", "training", "starved", "remote")
LABELS = {"env": "environment-bound", "transfer": "transfer-bound", "inference": "inference-bound",
          "training": "training-bound", "starved": "CPU-starved", "remote": "remote-transfer-bound"}

LEARNER_SATURATED = 0.75  # learner busy (copy + train) share above which training limits throughput
COPY_DOMINANT = 0.5  # share of the learner's busy time spent copying batches that makes it transfer-bound
STAGE_BUSY = 0.4  # busiest stage below this: every process mostly waits on the others -> transfer-bound
MACHINE_BUSY = 90.0  # machine CPU % above which a mostly-waiting run is probably starved by other jobs
REMOTE_MOSTLY = 0.5  # share of the interval's env steps from remote actor groups that makes them the supply
REMOTE_IDLE_LEARNER = 0.5  # learner waiting share above which remote slots arrive slower than it consumes them
STARVED_RUNQ = 0.1  # share of a worker type's wall time spent runnable without a core that counts as starved
OTHER_JOBS = 25.0  # % of the machine's CPU used outside this run above which its run-queue delay is theirs

REMEDIES = {
    "env": "stepping envs limits throughput (the policy worker and learner wait for experience): add envs "
           "or rollout processes (--envs-per-worker, --workers up to ~2x the cores), use a vectorised or "
           "C++ env (atari_* with --env-threads), a GPU-simulated env, or speed up the simulator",
    "transfer": "moving data between processes limits throughput: send fewer, bigger messages (more "
                "--envs-per-worker per split, fewer --worker-splits, longer --rollout), keep observations "
                "compact (uint8 frames), keep data in the shared buffers (no extra copies), and leave a core "
                "free per policy worker/learner",
    "inference": "the policy worker is saturated and the rollout workers wait for actions: add "
                 "--policy-workers, batch more envs per request (--envs-per-worker), run inference on a GPU "
                 "(--device cuda), or use a smaller model",
    "training": "the learner is saturated and rollout workers wait for free trajectory slots: train on a "
                "GPU (--device cuda) with bigger batches (--batch-size) and mixed precision, fewer "
                "--epochs/--minibatches, or a smaller model (--hidden-size); extra env workers will not help",
    "remote": "trajectories from the remote actor groups arrive slower than the learner trains on them: add "
              "--remote-workers or Ray nodes, more --remote-envs-per-worker per group (fewer, bigger shipments), "
              "keep observations compact (uint8 frames), or add local --workers beside them",
    "starved": "other jobs hold the cores and the run's workers wait for CPU time: stop or move the other "
               "jobs, give this run cores of its own (taskset/cgroups), or run fewer workers than free cores; "
               "the stage shares say nothing about the run itself until then",
}


REPLAY_TRAINING = ("the replay learner is saturated (it runs utd x env steps updates per batch) and rollout workers "
                   "wait for it: lower --utd or --sac-batch-size, a smaller --hidden-size, or train on a GPU "
                   "(--device cuda); if sampling dominates, the replay buffer's random reads are the cost "
                   "(smaller observations help); extra env workers will not help")


def replay_stages(m: Mapping[str, Any]) -> str:
    """`replay insert 2%, sample 9%, update 84%` from an off-policy learner's stage shares ('' for APPO)."""
    parts = [(stage, m.get(f"learner_{stage}_frac")) for stage in ("insert", "sample", "update")]
    if any(v is None for _, v in parts):
        return ""
    return "replay " + ", ".join(f"{stage} {_pct(v)}" for stage, v in parts)


@dataclass(frozen=True)
class Verdict:
    kind: str  # one of KINDS
    reason: str  # the evidence, e.g. "rollout workers step envs 95% of the time; learner waits 90%"
    remedy: str

    @property
    def label(self) -> str:
        return LABELS[self.kind]

    def line(self, solved: str = "") -> str:
        """The console line; `solved` (see `solved_note`) replaces the remedy once the run has solved its task."""
        return f"bottleneck: {self.label} ({self.reason}) -> {solved or self.remedy}"


def solved_return(env: str) -> float | None:
    """The return at which gymnasium calls `env` solved (its registry's `reward_threshold`), or None."""
    if ":" in env:  # module:Class or module:id: looking it up would import the user's module
        return None
    try:
        import gymnasium

        threshold = gymnasium.spec(env).reward_threshold
    except Exception:  # noqa: BLE001 - not a gymnasium id (an asyncrl env, module:Class): no threshold
        return None
    return None if threshold is None else float(threshold)


def solved_note(env: str, threshold: float, ret: float) -> str:
    """What the bottleneck line says instead of a remedy once the mean return reached the solved return."""
    return (f"no change needed: the mean return {ret:.1f} has reached {env}'s solved return ({threshold:g}); "
            "throughput advice matters for longer runs and harder tasks")


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _context(m: Mapping[str, Any]) -> str:
    gpu, system, run = m.get("gpu_util"), m.get("cpu_system"), m.get("cpu_run")
    out = "" if gpu is None else f"; GPU {gpu:.0f}% busy"
    starved = _starvation(m)
    if starved is not None:
        out += f"; other jobs starve it ({starved})"
    elif system is not None and run is not None and system >= MACHINE_BUSY and run < system / 2:
        out += f"; the machine's CPUs are {system:.0f}% busy but this run uses {run:.0f}%: other jobs starve it"
    return out


def _starvation(m: Mapping[str, Any]) -> str | None:
    """The evidence that other jobs starve this run's workers of CPU, or None when they do not."""
    runq = {who: m.get(f"{key}_runq_frac") for who, key in (("rollout workers", "rollout"),
                                                           ("policy workers", "policy"))}
    known = {who: v for who, v in runq.items() if v is not None}
    system, run = m.get("cpu_system"), m.get("cpu_run")
    if not known or max(known.values()) < STARVED_RUNQ or system is None or run is None:
        return None
    if system - run < OTHER_JOBS:  # the run's own processes queue for the cores: that is its own load
        return None
    waits = ", ".join(f"{who} {_pct(v)}" for who, v in known.items())
    return (f"waiting for a core: {waits} of the time, while other jobs use {system - run:.0f}% of the "
            f"machine's CPUs and this run {run:.0f}%")


def classify(m: Mapping[str, Any]) -> Verdict | None:
    """The bottleneck for one interval, or None without enough timings (the first seconds of a run).

    `m` is a metrics record: the stage fractions `rollout_env_frac`, `policy_infer_frac`, `learner_wait_frac`,
    `learner_copy_frac`, `learner_train_frac` (each a share of that process type's wall time, or None) decide;
    an off-policy learner's `learner_insert_frac`, `learner_sample_frac`, `learner_update_frac` split the training;
    `gpu_util`, `cpu_system` and `cpu_run` (% of the whole machine), when present, are quoted as evidence;
    with the workers' run-queue shares (`rollout_runq_frac`, `policy_runq_frac`) they also tell CPU starvation
    by other jobs, which takes the place of a transfer-bound reading (nobody busy because nobody gets a core).
    """
    env = m.get("rollout_env_frac")
    infer = m.get("policy_infer_frac")
    copy = m.get("learner_copy_frac") or 0.0
    train = m.get("learner_train_frac") or 0.0
    learner_wait = m.get("learner_wait_frac")
    context = _context(m)
    learner_busy = copy + train
    remote = _remote(m, learner_wait)
    if remote is not None:
        return remote
    if learner_wait is not None and learner_busy >= LEARNER_SATURATED:
        if copy >= COPY_DOMINANT * learner_busy:
            return Verdict("transfer", f"learner copies batches {_pct(copy)} of the time, trains "
                                       f"{_pct(train)}{context}", REMEDIES["transfer"])
        # Rollout workers blocked on a free slot for a whole interval send no timings at all.
        rollout = "send no timings (blocked)" if env is None else f"step envs only {_pct(env)}"
        stages = replay_stages(m)
        split = f" ({stages})" if stages else ""
        return Verdict("training", f"learner trains {_pct(train)} of the time{split} and never waits for data; "
                                   f"rollout workers {rollout}{context}",
                       REPLAY_TRAINING if stages else REMEDIES["training"])
    slot_wait = m.get("rollout_wait_slot_frac")
    if learner_wait is None and slot_wait is not None and slot_wait >= LEARNER_SATURATED:
        # An update longer than the interval sends no learner timings; workers blocked on free slots say enough.
        return Verdict("training", f"rollout workers wait for free trajectory slots {_pct(slot_wait)} of the time "
                                   f"while the learner is mid-update{context}", REMEDIES["training"])
    if env is None or infer is None:
        return None
    waits = "" if learner_wait is None else f"; learner waits {_pct(learner_wait)}"
    if max(env, infer) < STAGE_BUSY:
        starved = _starvation(m)
        if starved is not None:
            return Verdict("starved", f"{starved}; rollout workers step envs {_pct(env)}, the policy worker "
                                      f"infers {_pct(infer)}{waits}", REMEDIES["starved"])
        return Verdict("transfer", f"no stage is busy: rollout workers step envs {_pct(env)}, the policy worker "
                                   f"infers {_pct(infer)}{waits}{context}", REMEDIES["transfer"])
    if env >= infer:
        return Verdict("env", f"rollout workers step envs {_pct(env)} of the time, the policy worker infers "
                              f"{_pct(infer)}{waits}{context}", REMEDIES["env"])
    return Verdict("inference", f"the policy worker infers {_pct(infer)} of the time while rollout workers "
                                f"step envs {_pct(env)}{waits}{context}", REMEDIES["inference"])


def _remote(m: Mapping[str, Any], learner_wait: float | None) -> Verdict | None:
    """Remote transfer: most steps come from remote actor groups, the learner mostly waits for them and the Ray
    bridge does not wait for free slots (it has nothing to queue)."""
    share, slots = m.get("remote_share"), m.get("remote_slots_per_s")
    if share is None or slots is None or learner_wait is None:
        return None
    if share < REMOTE_MOSTLY or learner_wait < REMOTE_IDLE_LEARNER or (m.get("remote_wait_slot_frac") or 0.0) > 0.2:
        return None
    mb = (m.get("remote_bytes_per_s") or 0.0) / 1e6
    return Verdict("remote", f"{_pct(share)} of the steps come from remote groups, {slots:.1f} slots/s "
                             f"({mb:.1f} MB/s) through Ray; the learner waits {_pct(learner_wait)} of the time",
                   REMEDIES["remote"])


def dominant(kinds: list[str | None]) -> str | None:
    """The most frequent verdict of a run (ties go to the later one), ignoring intervals without one."""
    seen = [k for k in kinds if k in KINDS]
    if not seen:
        return None
    counts = {k: seen.count(k) for k in KINDS}
    best = max(counts.values())
    return next(k for k in reversed(seen) if counts[k] == best)
