"""Data-parallel learners over torch.distributed, for runs launched by torchrun.

Every rank is a whole asyncrl run (runner, rollout workers, policy workers, learner) on its own share of the
envs; `--workers` and `--envs-per-worker` are per rank. Only the learners form a process group (the runner
never imports torch): gloo on CPU, NCCL on CUDA. The learners

* start from rank 0's weights and optimizer state (broadcast after init or `--resume`; only rank 0 loads);
* average their gradients in one flat bucket every optimizer step, with a "loss is finite" flag in the same
  bucket, so every rank applies or skips the same step;
* agree once per update, in one small all-reduce, on the run's counters (env steps and episodes summed over the
  ranks, trained samples for the learning-rate schedule, the kl schedule's rate), on the running moments of the
  observation (and return) normalisers, pooled exactly over every rank's samples (`asyncrl.algo.moment_sync`),
  and on stopping, so every rank does the same number of updates and policy versions stay in lockstep.

Only rank 0 writes `metrics.jsonl`, TensorBoard and checkpoints; ranks > 0 use `RUN_DIR/rank<k>` for their own
files. A rank whose learner dies makes the others' collectives fail at once (gloo) or after `--dist-timeout`
seconds (a hung rank, NCCL); their learners report it as fatal and each runner stops.

Two sides, one module each, and no module state:

* `asyncrl.runtime.distributed.rank` (the runner's, torch-free): `for_this_rank(cfg)` reads the torchrun
  variables and returns this rank's settings (seed, device, run dir: a new Config, before validation) with a
  `DataParallel` holding the rank's state (its place, rank 0's run dir, the board it shares with its learner).
  The launcher hands that object to the runner, which uses it for the metrics writer, the agreed stop and the
  checkpoint hints, and passes it through the wiring to the learner process. Outside torchrun it is None.
* `asyncrl.runtime.distributed.group` (the learner's): `join_group(ranks, learner, channels)` joins the process
  group and returns a `Group`, whose methods are the learner's hooks (gradient averaging, the minimum update
  count, the per-update agreement, the checkpoint wrapper).
"""
