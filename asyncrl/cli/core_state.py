"""`asyncrl-diagnose RUN --core-state`: inside a recurrent run's latest policy over one episode of its env.

Prints, for the policy acting with sampled actions from a fresh episode (env seed `seed`):
- the encoder's features: their RMS, and their std over the episode's steps (the part that follows the frames);
- for an LSTM, the share of its cell units beyond |c| > 10 at the last step (the learner's `core_saturation`
  measures the same in the stored states), and the largest |c|: a cell that counts one a step has run away;
- the value's mean and std over the episode: a core whose output no longer follows its inputs gives a constant.

What docs/results.md measured Pong's LSTM runs with.
"""

from __future__ import annotations

import numpy as np

from asyncrl.diagnostics.rundir import RunDirError

RUNAWAY_CELL = 10.0  # asyncrl.agents.appo.learner.SATURATED_CELL
SEED = 1


def core_state(run_dir: str, steps: int, seed: int = SEED) -> None:
    """Play at most `steps` steps of one episode with the run's policy and print what its encoder and core did.
    Raises RunDirError (or EnvError) for a run that is not a recurrent one or cannot be loaded."""
    import torch

    from asyncrl.config import Config
    from asyncrl.envs.dict_obs import obs_zeros, zeros_like
    from asyncrl.envs.registry import make_vec_env
    from asyncrl.models.actor_critic import RecurrentActorCritic
    from asyncrl.models.obs import obs_from_numpy
    from asyncrl.policy import PolicyLoadError, load_run_policy

    torch.set_num_threads(1)
    try:
        run = load_run_policy(run_dir)
    except PolicyLoadError as exc:
        raise RunDirError(str(exc)) from None
    model = run.model.float().eval()
    if not isinstance(model, RecurrentActorCritic):
        raise RunDirError(f"{run_dir} is not a recurrent run (train it with --rnn gru|lstm)")
    env = make_vec_env(Config.from_dict(run.config), 1, training=False, env=run.spec.name)
    obs = obs_zeros(env.spec, 1)
    reward, terminated, truncated = np.zeros(1, np.float32), np.zeros(1, np.bool_), np.zeros(1, np.bool_)
    final_obs, actions = zeros_like(obs), np.zeros((1, *env.spec.action_shape), dtype=env.spec.action_dtype)
    env.reset(seed=seed, obs_out=obs)
    state, features, values = model.initial_state(1), [], []
    try:
        with torch.no_grad():
            for _ in range(steps):
                x = obs_from_numpy(obs, "cpu")
                features.append(model.features(x)[0])
                out, value, state = model.step(x, state, None)
                values.append(float(value[0]))
                actions[:] = model.distribution(out).sample().numpy()
                env.step(actions, obs, reward, terminated, truncated, final_obs)
                if terminated[0] or truncated[0]:
                    break
    finally:
        env.close()
    feats = torch.stack(features)
    print(f"{run_dir}: policy version {run.version}, {len(values)} steps")
    print(f"  encoder features: RMS {feats.pow(2).mean().sqrt():.4g}, std over the steps {feats.std(0).mean():.4g}")
    if "c" in state:
        cells = state["c"].abs()
        print(f"  LSTM cells at the last step: {float((cells > RUNAWAY_CELL).float().mean()):.1%} beyond |c| > "
              f"{RUNAWAY_CELL:g}, largest |c| {float(cells.max()):.4g}")
    print(f"  value: mean {np.mean(values):.4g}, std over the steps {np.std(values):.4g}")
