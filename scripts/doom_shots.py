"""Where a Doom policy's points go: shots fired, kills, misses and deaths per episode.

    .venv/bin/python scripts/doom_shots.py runs/dtc_gru/seed0 --episodes 20 --greedy

Plays the run's latest good checkpoint as `asyncrl-enjoy` does (same env seed by default) and reads the game
variables after every step: a shot is a drop of the selected weapon's ammunition, a kill a rise of KILLCOUNT. A
shot that no kill follows within the step it was fired in or the next counts as a miss (the pistol is hitscan;
a shot still waiting when the episode ends counts as one too).
Shots are split by the trigger: `tapped` where the policy let go of ATTACK at some step since its last shot,
`held` where it kept ATTACK down from that shot on (Doom fires such a refire with a random spread).
On defend_the_center (26 rounds, +1 a kill, -1 on death) an episode that ends in death scores 25 less its misses.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from asyncrl.diagnostics.rundir import RunDirError, require_dir
from asyncrl.envs.base import EnvError
from asyncrl.envs.doom import GAME_VARIABLES

AMMO, KILLS = GAME_VARIABLES.index("SELECTED_WEAPON_AMMO"), GAME_VARIABLES.index("KILLCOUNT")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="a doom_* run's directory (TRAIN_DIR/EXPERIMENT)")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--greedy", action="store_true", help="the most likely action instead of sampling")
    parser.add_argument("--seed", type=int, default=12345, help="env seed (asyncrl-enjoy's default)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import torch

    from asyncrl.agents.acting import module_device
    from asyncrl.cli import enjoy
    from asyncrl.envs.dict_obs import obs_zeros, zeros_like
    from asyncrl.models.obs import obs_from_numpy

    args = parse_args(argv)
    try:
        require_dir(args.run_dir)
        head, env = enjoy.load(enjoy.parse_args([args.run_dir, "--seed", str(args.seed)]))
    except (RunDirError, EnvError) as exc:
        print(f"doom_shots: error: {exc}", file=sys.stderr)
        return 2
    if not env.spec.name.startswith("doom_"):
        env.close()
        print(f"doom_shots: error: {args.run_dir} trained {env.spec.name}, not a doom_* env", file=sys.stderr)
        return 2
    attacks = np.array(["ATTACK" in option for option in env.scenario.actions])
    obs, rew = obs_zeros(env.spec, 1), np.zeros(1, np.float32)
    final, terminated, truncated = zeros_like(obs), np.zeros(1, np.bool_), np.zeros(1, np.bool_)
    actions = np.zeros((1, *env.spec.action_shape), env.spec.action_dtype)
    env.reset(seed=args.seed, obs_out=obs)
    device = module_device(head)
    state, first = head.initial_state(1), torch.ones(1, dtype=torch.bool, device=device)
    shots, hits = {"tapped": 0, "held": 0}, {"tapped": 0, "held": 0}
    returns, misses_per_episode, deaths = [], [], 0
    before, tapped, pending, step, misses = env.game_variables[0].copy(), True, [], 0, 0
    try:
        while len(returns) < args.episodes:
            with torch.no_grad():
                action, _, state = head.act(obs_from_numpy(obs, device), state, first, greedy=args.greedy)
            actions[:] = action.cpu().numpy()
            tapped |= not attacks[int(actions[0])]
            finished = env.step(actions, obs, rew, terminated, truncated, final)
            first[:] = torch.from_numpy(terminated | truncated)
            step += 1
            after = env.game_variables[0]  # on the step an episode ends: the next one's first frame
            if not finished:
                for _ in range(int(before[AMMO] - after[AMMO])):
                    kind = "tapped" if tapped else "held"
                    shots[kind] += 1
                    pending.append((kind, step))
                    tapped = False
                for _ in range(int(after[KILLS] - before[KILLS])):
                    if pending:
                        hits[pending.pop(0)[0]] += 1
            misses += sum(fired < step or bool(finished) for _, fired in pending)  # their window has passed
            pending = [(kind, fired) for kind, fired in pending if fired == step and not finished]
            if finished:
                episode = finished[0]
                deaths += not episode.truncated
                returns.append(episode.ret)
                misses_per_episode.append(misses)
                print(f"episode {len(returns)}: return {episode.ret:g}, {misses} missed, "
                      f"{'died' if not episode.truncated else 'cut by the time limit'} after {episode.length} steps")
                before, tapped, step, misses = env.game_variables[0].copy(), True, 0, 0
            else:
                before = after.copy()
    finally:
        env.close()
    print(f"{args.episodes} episodes ({'greedy' if args.greedy else 'sampled'}): return mean "
          f"{statistics.fmean(returns):.2f} +/- {statistics.pstdev(returns):.2f}, misses per episode "
          f"{statistics.fmean(misses_per_episode):.2f}, deaths {deaths}")
    for kind in shots:
        rate = 1 - hits[kind] / shots[kind] if shots[kind] else 0.0
        print(f"  {kind:6s} shots {shots[kind]:5d}, kills {hits[kind]:5d}, miss rate {rate:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
