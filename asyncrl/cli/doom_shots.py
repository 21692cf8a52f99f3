"""`asyncrl-diagnose RUN --shots`: where a Doom policy's points go (shots fired, kills, misses, deaths per episode).

Plays the run's latest good checkpoint as `asyncrl-enjoy` does (same env seed by default) and reads the game
variables after every step: a shot is a drop of the selected weapon's ammunition, a kill a rise of KILLCOUNT. A
shot that no kill follows within the step it was fired in or the next counts as a miss (the pistol is hitscan;
a shot still waiting when the episode ends counts as one too).
Shots are split by the trigger: `tapped` where the policy let go of ATTACK at some step since its last shot,
`held` where it kept ATTACK down from that shot on (Doom fires such a refire with a random spread).
On defend_the_center (26 rounds, +1 a kill, -1 on death) an episode that ends in death scores 25 less its misses.
"""

from __future__ import annotations

import statistics

import numpy as np

from asyncrl.diagnostics.rundir import RunDirError, require_dir

SEED = 12345  # asyncrl-enjoy's env seed


def doom_shots(run_dir: str, episodes: int, greedy: bool = False, seed: int = SEED) -> None:
    """Play `episodes` episodes of the doom_* run in `run_dir` and print each one's misses, then the shots, kills
    and miss rate by trigger. Raises RunDirError (or EnvError) for a run it cannot play."""
    import torch

    from asyncrl.agents.acting import module_device
    from asyncrl.cli import enjoy
    from asyncrl.envs.dict_obs import obs_zeros, zeros_like
    from asyncrl.envs.doom import GAME_VARIABLES
    from asyncrl.models.obs import obs_from_numpy

    ammo, kills = GAME_VARIABLES.index("SELECTED_WEAPON_AMMO"), GAME_VARIABLES.index("KILLCOUNT")
    require_dir(run_dir)
    head, env = enjoy.load(enjoy.parse_args([run_dir, "--seed", str(seed)]))
    if not env.spec.name.startswith("doom_"):
        env.close()
        raise RunDirError(f"{run_dir} trained {env.spec.name}, not a doom_* env")
    attacks = np.array(["ATTACK" in option for option in env.scenario.actions])
    obs, rew = obs_zeros(env.spec, 1), np.zeros(1, np.float32)
    final, terminated, truncated = zeros_like(obs), np.zeros(1, np.bool_), np.zeros(1, np.bool_)
    actions = np.zeros((1, *env.spec.action_shape), env.spec.action_dtype)
    env.reset(seed=seed, obs_out=obs)
    device = module_device(head)
    state, first = head.initial_state(1), torch.ones(1, dtype=torch.bool, device=device)
    shots, hits = {"tapped": 0, "held": 0}, {"tapped": 0, "held": 0}
    returns, misses_per_episode, deaths = [], [], 0
    before, tapped, pending, step, misses = env.game_variables[0].copy(), True, [], 0, 0
    try:
        while len(returns) < episodes:
            with torch.no_grad():
                action, _, state = head.act(obs_from_numpy(obs, device), state, first, greedy=greedy)
            actions[:] = action.cpu().numpy()
            tapped |= not attacks[int(actions[0])]
            finished = env.step(actions, obs, rew, terminated, truncated, final)
            first[:] = torch.from_numpy(terminated | truncated)
            step += 1
            after = env.game_variables[0]  # on the step an episode ends: the next one's first frame
            if not finished:
                for _ in range(int(before[ammo] - after[ammo])):
                    kind = "tapped" if tapped else "held"
                    shots[kind] += 1
                    pending.append((kind, step))
                    tapped = False
                for _ in range(int(after[kills] - before[kills])):
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
    print(f"{episodes} episodes ({'greedy' if greedy else 'sampled'}): return mean "
          f"{statistics.fmean(returns):.2f} +/- {statistics.pstdev(returns):.2f}, misses per episode "
          f"{statistics.fmean(misses_per_episode):.2f}, deaths {deaths}")
    for kind in shots:
        rate = 1 - hits[kind] / shots[kind] if shots[kind] else 0.0
        print(f"  {kind:6s} shots {shots[kind]:5d}, kills {hits[kind]:5d}, miss rate {rate:.3f}")
