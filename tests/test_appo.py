"""The APPO objective: V-trace targets wired into the PPO surrogate, value loss and entropy bonus."""

from __future__ import annotations

import torch

from asyncrl.agents.appo.loss import APPOHyperparams, appo_loss
from asyncrl.algo.vtrace import vtrace


def _batch(t: int = 6, b: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(t, b, generator=g).mul(0.1).sub(1.0).requires_grad_()
    behaviour = logp.detach() + torch.randn(t, b, generator=g) * 0.05
    values = torch.randn(t + 1, b, generator=g).requires_grad_()
    rewards = torch.randn(t, b, generator=g)
    dones = (torch.rand(t, b, generator=g) < 0.2).float()
    entropy = torch.rand(t, b, generator=g).requires_grad_()
    return logp, entropy, values, behaviour, rewards, dones


def test_value_loss_uses_vtrace_targets_with_bootstrap() -> None:
    logp, entropy, values, behaviour, rewards, dones = _batch()
    hp = APPOHyperparams(gamma=0.9, normalize_advantages=False)
    mask = torch.ones_like(rewards)
    _, stats = appo_loss(logp, entropy, values, behaviour, rewards, dones, mask, hp)
    ref = vtrace(behaviour, logp.detach(), rewards, values[:-1].detach(), values[-1].detach(), 0.9 * (1 - dones))
    expected = 0.5 * (values[:-1].detach() - ref.vs).square().mean()
    assert torch.allclose(stats["value_loss"], expected, atol=1e-6)


def test_total_loss_combines_terms_with_coefficients() -> None:
    logp, entropy, values, behaviour, rewards, dones = _batch(seed=1)
    hp = APPOHyperparams(value_coeff=0.25, entropy_coeff=0.1)
    mask = torch.ones_like(rewards)
    loss, stats = appo_loss(logp, entropy, values, behaviour, rewards, dones, mask, hp)
    expected = stats["policy_loss"] + 0.25 * stats["value_loss"] - 0.1 * stats["entropy"]
    assert torch.allclose(loss.detach(), expected, atol=1e-6)


def test_masked_samples_get_no_gradient() -> None:
    logp, entropy, values, behaviour, rewards, dones = _batch(seed=2)
    mask = torch.ones_like(rewards)
    mask[:, 0] = 0.0  # a stale env column
    loss, _ = appo_loss(logp, entropy, values, behaviour, rewards, dones, mask, APPOHyperparams())
    loss.backward()
    assert torch.all(logp.grad[:, 0] == 0) and torch.all(entropy.grad[:, 0] == 0)
    assert torch.all(values.grad[:-1, 0] == 0)
    assert logp.grad[:, 1:].abs().sum() > 0


def test_positive_advantage_raises_action_probability() -> None:
    t, b = 1, 1
    logp = torch.full((t, b), -1.0, requires_grad=True)
    behaviour = torch.full((t, b), -1.0)
    values = torch.zeros(t + 1, b, requires_grad=True)
    rewards = torch.ones(t, b)  # better than V = 0: advantage +1
    hp = APPOHyperparams(normalize_advantages=False, entropy_coeff=0.0)
    loss, _ = appo_loss(logp, torch.zeros(t, b), values, behaviour, rewards, torch.ones(t, b),
                        torch.ones(t, b), hp)
    loss.backward()
    assert logp.grad.item() < 0  # gradient descent increases log pi(a|s)


def test_centered_values_read_the_head_plus_the_offset_and_fit_a_new_one() -> None:
    """--center-values: V-trace reads head + offset, the new offset is the targets' mean gap to the head, and the
    head learns the targets minus it (so a constant shift of the head gets no gradient)."""
    logp, entropy, values, behaviour, rewards, dones = _batch(seed=4)
    rewards = rewards - 3.0  # returns far below the head's values, as early Pong's
    hp = APPOHyperparams(gamma=0.9, normalize_advantages=False)
    mask = torch.ones_like(rewards)
    mask[:, 2] = 0.0
    offset = -5.0
    _, stats = appo_loss(logp, entropy, values, behaviour, rewards, dones, mask, hp, value_offset=offset)
    shifted = values.detach() + offset
    ref = vtrace(behaviour, logp.detach(), rewards, shifted[:-1], shifted[-1], 0.9 * (1 - dones))
    gap = (ref.vs - values[:-1].detach())[:, :2]
    assert torch.allclose(stats["value_offset"], gap.mean(), atol=1e-5)
    assert torch.allclose(stats["value_loss"], 0.5 * (gap - gap.mean()).square().mean(), atol=1e-5)
    # The head's error has mean 0 over the trained samples: no push towards a constant.
    bias = torch.zeros((), requires_grad=True)
    loss, _ = appo_loss(logp, entropy, values.detach() + bias, behaviour, rewards, dones, mask, hp,
                        value_offset=offset)
    (grad,) = torch.autograd.grad(loss, bias)
    assert abs(float(grad)) < 1e-5
    # Without it, the same head is pulled towards the returns.
    loss, _ = appo_loss(logp, entropy, values.detach() + bias, behaviour, rewards, dones, mask, hp)
    (grad,) = torch.autograd.grad(loss, bias)
    assert float(grad) > 0.1


def test_the_value_offset_is_learner_state() -> None:
    """Checkpoints, resume and PBT's exploit step carry --center-values' offset with the weights it goes with."""
    from asyncrl.agents.appo.learner import APPOLearner
    from asyncrl.config import Config
    from asyncrl.envs.registry import make_env_spec

    cfg = Config(env="CartPole-v1", center_values=True)
    spec = make_env_spec(cfg)
    saved = APPOLearner(cfg, spec, torch.device("cpu"))
    saved.value_offset = -1.75
    for restore in ("load_state_dict", "adopt"):
        learner = APPOLearner(cfg, spec, torch.device("cpu"))
        assert learner.value_offset == 0.0
        getattr(learner, restore)(saved.state_dict() if restore == "load_state_dict" else saved)
        assert learner.value_offset == -1.75, restore
    assert APPOLearner(Config(env="CartPole-v1"), spec, torch.device("cpu")).value_offset is None


def test_an_lstm_centres_its_values_unless_told_not_to() -> None:
    from asyncrl.resolve import config_from_flags

    assert config_from_flags(env="CartPole-v1", rnn="lstm").center_values
    assert not config_from_flags(env="CartPole-v1", rnn="lstm", center_values=False).center_values
    assert not config_from_flags(env="CartPole-v1", rnn="gru").center_values
    assert not config_from_flags(env="CartPole-v1").center_values


def _stale_batch(spec, t: int, b: int, seed: int):
    """A batch acted by a policy unlike the learner's: random actions with log-probs well away from its own."""
    from asyncrl.agents.synthetic import synthetic_batch

    g = torch.Generator().manual_seed(seed)
    batch = synthetic_batch(spec, t, b, torch.device("cpu"))
    batch.obs = torch.randn(batch.obs.shape, generator=g)
    batch.actions = torch.randint(0, spec.num_actions, batch.actions.shape, generator=g)
    batch.behaviour_logp = torch.log(torch.rand(t, b, generator=g) * 0.9 + 0.05)
    batch.rewards = torch.randn(t, b, generator=g)
    batch.lag = torch.full((t, b), 2)
    return batch


def test_clip_reference_learner_takes_the_ratio_against_the_policy_before_the_update() -> None:
    """--clip-reference learner: the first step of an update starts at ratio 1 (no sample clipped, KL 0) however
    stale the batch, and the steps after it move away from there; `acting` measures from the acting policy. The
    recurrent unroll and the pure path (--precision bf16-all) compute the same anchor."""
    from asyncrl.agents.appo.learner import APPOLearner
    from asyncrl.config import Config
    from asyncrl.envs.registry import make_env_spec

    for extra in ({}, {"rnn": "gru", "rnn_size": 16}, {"precision": "bf16-all"}):
        spec = None
        first: dict[str, dict[str, float]] = {}
        for reference in ("acting", "learner"):
            torch.manual_seed(0)
            cfg = Config(env="CartPole-v1", epochs=2, minibatches=1, lr=1e-2, clip_reference=reference, **extra)
            spec = spec or make_env_spec(cfg)
            learner = APPOLearner(cfg, spec, torch.device("cpu"))
            steps: list[dict[str, float]] = []
            step = learner._step
            learner._step = lambda *a, _step=step, _out=steps: _out.append(_step(*a)) or _out[-1]
            learner.train(_stale_batch(spec, 8, 4, seed=1), frames=0)
            first[reference] = steps[0]
            if reference == "learner":
                assert steps[1]["kl"] > 0.0, extra
        assert first["learner"]["clip_fraction"] == 0.0 and abs(first["learner"]["kl"]) < 1e-5, extra
        assert first["acting"]["clip_fraction"] > 0.5 and first["acting"]["kl"] > 0.05, extra
        # the policy loss differs (the ratio's reference), the value loss does not (V-trace is unchanged)
        assert first["learner"]["policy_loss"] != first["acting"]["policy_loss"], extra
        assert abs(first["learner"]["value_loss"] - first["acting"]["value_loss"]) < 1e-4, extra
