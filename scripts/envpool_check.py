"""Learning on EnvPool's and MuJoCo Playground's envs against a random policy: docs/env-backends.md's and
docs/results.md's figures for issue 56.

Each case is one `asyncrl-train` command (printed before it runs). The random baseline is the mean return of
`--random-episodes` episodes of uniformly random actions through the same asyncrl backend (its VecEnv, no
training). A run is judged by the best `episode_return_mean` it reported (the last 100 episodes) after its first
record: it learned when that is above both the random mean plus 2 standard errors of the random episodes and the
run's own first scored record (its untrained policy; SAC's first episodes, uniformly random actions of its warm-up,
scored 5.48 and 6.34 on CheetahRun-v1 in two runs where this script's random episodes scored 3.59 +- 0.24: the
random baseline alone is too low a bar).

    nice -n 19 .venv/bin/python scripts/envpool_check.py procgen_bigfish            # one case
    nice -n 19 .venv/bin/python scripts/envpool_check.py dmc_sac dmc_appo --seed 1
    .venv/bin/python scripts/envpool_check.py --spaces    # every EnvPool id described: how many, the refusals

Exit code 1 unless every case learned. Run one at a time on a shared machine (each uses every core it is given).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / ".venv" / "bin" / "asyncrl-train")

CASES: dict[str, list[str]] = {
    # Procgen's BigFish (easy): IMPALA's residual encoder on EnvPool's 64x64 frames
    # (a budget of 10 minutes' wall clock: its frames depend on the machine's load)
    "procgen_bigfish": ["--env", "envpool:BigfishEasy-v0", "--encoder", "impala", "--seconds", "600"],
    # DeepMind Control's cheetah running, its Dict observation flattened to 17 floats
    "dmc_sac": ["--env", "envpool:CheetahRun-v1", "--algo", "sac", "--frames", "40000"],
    "dmc_appo": ["--env", "envpool:CheetahRun-v1", "--normalize-obs", "--normalize-returns", "--rollout", "64",
                 "--epochs", "10", "--minibatches", "8", "--lr", "3e-4", "--value-coeff", "0.5",
                 "--envs-per-worker", "16", "--frames", "1000000"],
    # MuJoCo Playground's cart-pole balance (MJX's JAX implementation on the CPU), dmc_appo's settings
    "playground_cartpole": ["--env", "playground:CartpoleBalance", "--workers", "1", "--envs-per-worker", "32",
                            "--normalize-obs", "--normalize-returns", "--rollout", "64", "--epochs", "10",
                            "--minibatches", "8", "--lr", "3e-4", "--value-coeff", "0.5", "--frames", "600000"],
}


def random_returns(env: str, episodes: int, seed: int = 0) -> np.ndarray:
    """Returns of `episodes` episodes of uniformly random actions through asyncrl's backend for `env`."""
    from asyncrl.envs.registry import make_vec_env

    n = min(episodes, 16)
    vec = make_vec_env(env, n)
    spec = vec.spec
    obs = np.zeros((n, *spec.obs_shape), dtype=spec.obs_dtype)
    final, reward = obs.copy(), np.zeros(n, np.float32)
    term, trunc = np.zeros(n, bool), np.zeros(n, bool)
    vec.reset(seed, obs)
    space = spec.action_space
    space.seed(seed)
    done: list[float] = []
    while len(done) < episodes:
        actions = np.stack([np.asarray(space.sample()) for _ in range(n)]).astype(spec.action_dtype)
        done += [e.ret for e in vec.step(actions, obs, reward, term, trunc, final)]
    vec.close()
    return np.array(done[:episodes])


def spaces() -> int:
    """Describe every id `envpool.list_all_envs()` lists through asyncrl (no pool made): the count that works per
    EnvPool family, and each distinct refusal (its one line) with how many ids it refused and one of them."""
    import collections
    import warnings

    from asyncrl.envs.base import EnvError
    from asyncrl.envs.envpool_env import envpool_module
    from asyncrl.envs.registry import make_env_spec

    warnings.simplefilter("ignore")
    envpool = envpool_module()
    ok: collections.Counter[str] = collections.Counter()
    refused: collections.Counter[str] = collections.Counter()
    example: dict[str, str] = {}
    for task in envpool.list_all_envs():
        try:
            make_env_spec("envpool:" + task)
            ok[envpool.registration.registry.specs[task][0]] += 1
        except EnvError as e:
            why = str(e).replace(task, "<id>").split(";")[0]
            refused[why] += 1
            example.setdefault(why, task)
    print(f"{sum(ok.values())} of {sum(ok.values()) + sum(refused.values())} ids described: {dict(ok)}")
    for why, count in refused.most_common():
        print(f"{count} refused ({example[why]}): {why}")
    return 0


def train(case: str, args: list[str], seed: int, train_dir: str) -> tuple[list[dict], float]:
    """Run one case; its metrics records ([] if it failed, said on stderr) and its wall time."""
    cmd = [TRAIN, *args, "--seed", str(seed), "--train-dir", train_dir, "--experiment", case]
    print("$", " ".join(cmd[1:]), flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    path = Path(train_dir) / case / "metrics.jsonl"
    if proc.returncode != 0 or not path.exists():
        print(f"{case}: asyncrl-train exited {proc.returncode}: {proc.stderr.strip()[-800:]}", file=sys.stderr)
        return [], time.monotonic() - start
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records, time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", choices=sorted(CASES))
    parser.add_argument("--spaces", action="store_true", help="describe every EnvPool id instead")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--random-episodes", type=int, default=32)
    opts = parser.parse_args()
    if opts.spaces:
        return spaces()
    learned = True
    for case in opts.cases:
        args = CASES[case]
        env = args[args.index("--env") + 1]
        rand = random_returns(env, opts.random_episodes, opts.seed)
        se = rand.std(ddof=1) / np.sqrt(len(rand))
        with tempfile.TemporaryDirectory(prefix="envpool-check-") as tmp:
            records, wall = train(case, args, opts.seed, tmp)
        scored = [r for r in records if r.get("episode_return_mean") is not None]
        if not scored:
            learned = False
            print(f"{case}: no episode finished", flush=True)
            continue
        first, best = scored[0], max(scored, key=lambda r: r["episode_return_mean"])
        bar = max(rand.mean() + 2 * se, first["episode_return_mean"])
        ok = best["episode_return_mean"] > bar
        learned &= ok
        last = records[-1]
        print(f"{case}: random {rand.mean():.2f} +- {se:.2f} ({len(rand)} episodes); first record "
              f"{first['episode_return_mean']:.2f} at {first['env_steps']:,} env steps; best "
              f"{best['episode_return_mean']:.2f} at {best['env_steps']:,}; last {last.get('episode_return_mean')} "
              f"at {last['env_steps']:,} env steps, {wall:.0f} s -> {'learned' if ok else 'NOT above random'}",
              flush=True)
    return 0 if learned else 1


if __name__ == "__main__":
    sys.exit(main())
