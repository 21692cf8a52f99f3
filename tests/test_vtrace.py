"""Check `vtrace` against references written directly from the definitions (Espeholt et al. 2018)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncrl.algo.vtrace import VTraceReturns, vtrace

ATOL = 1e-5
RTOL = 1e-5


def reference_vtrace_sum(
    behaviour_logp: np.ndarray,
    target_logp: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: np.ndarray,
    discounts: np.ndarray,
    rho_bar: float,
    c_bar: float,
    pg_rho_bar: float,
) -> tuple[np.ndarray, np.ndarray]:
    """IMPALA eq. 1 as an explicit n-step sum, float64, plain loops (no recursion).

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} discount_i) (prod_{i=s}^{t-1} c_i) delta_t,
    delta_t = rho_t (r_t + discount_t V(x_{t+1}) - V(x_t)), with V(x_T) = bootstrap_value.
    pg_adv_s = min(pg_rho_bar, pi/mu) (r_s + discount_s v_{s+1} - V(x_s)), v_T = V(x_T).
    """
    T, B = values.shape
    vs = np.zeros((T, B))
    pg = np.zeros((T, B))
    for b in range(B):
        v_ext = [float(values[t, b]) for t in range(T)] + [float(bootstrap_value[b])]
        ratio = [float(np.exp(target_logp[t, b] - behaviour_logp[t, b])) for t in range(T)]
        rho = [min(rho_bar, r) for r in ratio]
        c = [min(c_bar, r) for r in ratio]
        delta = [rho[t] * (rewards[t, b] + discounts[t, b] * v_ext[t + 1] - v_ext[t]) for t in range(T)]
        for s in range(T):
            total = v_ext[s]
            for t in range(s, T):
                weight = 1.0
                for i in range(s, t):  # empty product when t == s
                    weight *= discounts[i, b] * c[i]
                total += weight * delta[t]
            vs[s, b] = total
        for s in range(T):
            v_next = vs[s + 1, b] if s + 1 < T else v_ext[T]
            pg[s, b] = min(pg_rho_bar, ratio[s]) * (rewards[s, b] + discounts[s, b] * v_next - v_ext[s])
    return vs, pg


def discounted_return(rewards: np.ndarray, bootstrap_value: np.ndarray, discounts: np.ndarray) -> np.ndarray:
    """On-policy n-step return bootstrapped by V(x_T): no importance weights at all.

    G_s = sum_{t=s}^{T-1} (prod_{i=s}^{t-1} discount_i) r_t + (prod_{i=s}^{T-1} discount_i) V(x_T).
    """
    T, B = rewards.shape
    out = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            g, running = 0.0, 1.0
            for t in range(s, T):
                g += running * rewards[t, b]
                running *= discounts[t, b]
            out[s, b] = g + running * bootstrap_value[b]
    return out


def make_batch(
    seed: int, T: int, B: int, gamma: float = 0.97, done_prob: float = 0.2, spread: float = 0.7
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    behaviour_logp = rng.normal(-1.0, 0.5, size=(T, B))
    target_logp = behaviour_logp + rng.normal(0.0, spread, size=(T, B))
    dones = rng.random((T, B)) < done_prob
    return {
        "behaviour_logp": behaviour_logp,
        "target_logp": target_logp,
        "rewards": rng.normal(0.0, 1.0, size=(T, B)),
        "values": rng.normal(0.0, 1.0, size=(T, B)),
        "bootstrap_value": rng.normal(0.0, 1.0, size=(B,)),
        "discounts": gamma * (1.0 - dones.astype(np.float64)),
    }


def run_vtrace(batch: dict[str, np.ndarray], **kwargs: float | None) -> VTraceReturns:
    tensors = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in batch.items()}
    return vtrace(**tensors, **kwargs)


def assert_close(actual: torch.Tensor, expected: np.ndarray) -> None:
    np.testing.assert_allclose(actual.numpy().astype(np.float64), expected, atol=ATOL, rtol=RTOL)


SHAPES = [(1, 1), (1, 3), (5, 1), (5, 3), (20, 1), (20, 3)]
CLIPS = [
    # (rho_bar, c_bar, pg_rho_bar)
    (1.0, 1.0, None),
    (0.5, 2.0, None),
    (2.0, 0.5, None),
    (1.5, 1.5, 0.8),
    (100.0, 100.0, None),  # effectively unclipped importance sampling
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("T", "B"), SHAPES)
@pytest.mark.parametrize(("rho_bar", "c_bar", "pg_rho_bar"), CLIPS)
def test_matches_nstep_sum_definition(
    seed: int, T: int, B: int, rho_bar: float, c_bar: float, pg_rho_bar: float | None
) -> None:
    batch = make_batch(seed, T, B)
    out = run_vtrace(batch, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar)
    ref_vs, ref_pg = reference_vtrace_sum(
        **batch, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=rho_bar if pg_rho_bar is None else pg_rho_bar
    )
    assert out.vs.shape == (T, B) and out.pg_advantages.shape == (T, B) and out.rhos.shape == (T, B)
    assert_close(out.vs, ref_vs)
    assert_close(out.pg_advantages, ref_pg)
    assert_close(out.rhos, np.exp(batch["target_logp"] - batch["behaviour_logp"]))


@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize(("T", "B"), [(5, 3), (20, 3)])
def test_frequent_episode_ends(seed: int, T: int, B: int) -> None:
    # Half the steps terminate; the first and last steps are forced to be terminal for some columns.
    batch = make_batch(seed, T, B, done_prob=0.5)
    batch["discounts"][0, 0] = 0.0
    batch["discounts"][-1, -1] = 0.0
    out = run_vtrace(batch, rho_bar=0.5, c_bar=2.0)
    ref_vs, ref_pg = reference_vtrace_sum(**batch, rho_bar=0.5, c_bar=2.0, pg_rho_bar=0.5)
    assert_close(out.vs, ref_vs)
    assert_close(out.pg_advantages, ref_pg)


def test_episode_end_blocks_future_information() -> None:
    # If the episode ends after step k, targets for s <= k must not depend on anything after k.
    T, B, k = 10, 2, 4
    batch = make_batch(7, T, B)
    batch["discounts"][:] = 0.9
    batch["discounts"][k] = 0.0
    base = run_vtrace(batch, rho_bar=1.0, c_bar=1.0)
    perturbed = {key: v.copy() for key, v in batch.items()}
    perturbed["rewards"][k + 1 :] += 10.0
    perturbed["values"][k + 1 :] -= 5.0
    perturbed["target_logp"][k + 1 :] += 0.3
    perturbed["bootstrap_value"] += 3.0
    other = run_vtrace(perturbed, rho_bar=1.0, c_bar=1.0)
    torch.testing.assert_close(base.vs[: k + 1], other.vs[: k + 1])
    torch.testing.assert_close(base.pg_advantages[: k + 1], other.pg_advantages[: k + 1])
    assert not torch.allclose(base.vs[k + 1 :], other.vs[k + 1 :])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(("T", "B"), SHAPES)
def test_on_policy_equals_nstep_return(seed: int, T: int, B: int) -> None:
    # With pi == mu and rho_bar = c_bar = 1 every rho_s = c_s = 1, so v_s telescopes to the plain
    # n-step discounted return bootstrapped by V(x_T) (IMPALA sec. 4.1, "on-policy case").
    batch = make_batch(seed, T, B)
    batch["target_logp"] = batch["behaviour_logp"].copy()
    out = run_vtrace(batch, rho_bar=1.0, c_bar=1.0)
    expected_vs = discounted_return(batch["rewards"], batch["bootstrap_value"], batch["discounts"])
    assert_close(out.vs, expected_vs)
    assert_close(out.rhos, np.ones((T, B)))
    # pg advantage = r_s + discount_s * G_{s+1} - V(x_s) = G_s - V(x_s) on-policy.
    assert_close(out.pg_advantages, expected_vs - batch["values"])


def test_single_step_by_hand() -> None:
    # T = 1, B = 1: pi/mu = exp(0.5) ~ 1.6487 -> rho = min(1, 1.6487) = 1.
    # delta = 1 * (r + discount * V(x_1) - V(x_0)) = 1 + 0.9 * 2 - 0.5 = 2.3 -> v_0 = 0.5 + 2.3 = 2.8.
    # pg adv = min(1, 1.6487) * (1 + 0.9 * 2 - 0.5) = 2.3.
    out = vtrace(
        behaviour_logp=torch.tensor([[-1.0]]),
        target_logp=torch.tensor([[-0.5]]),
        rewards=torch.tensor([[1.0]]),
        values=torch.tensor([[0.5]]),
        bootstrap_value=torch.tensor([2.0]),
        discounts=torch.tensor([[0.9]]),
    )
    torch.testing.assert_close(out.vs, torch.tensor([[2.8]]))
    torch.testing.assert_close(out.pg_advantages, torch.tensor([[2.3]]))
    torch.testing.assert_close(out.rhos, torch.tensor([[float(np.exp(0.5))]]))


def test_outputs_are_detached_float32() -> None:
    batch = make_batch(0, 6, 2)
    tensors = {k: torch.as_tensor(v, dtype=torch.float64).requires_grad_() for k, v in batch.items()}
    out = vtrace(**tensors)
    for t in (out.vs, out.pg_advantages, out.rhos):
        assert t.dtype == torch.float32
        assert not t.requires_grad
    ref_vs, _ = reference_vtrace_sum(**batch, rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0)
    assert_close(out.vs, ref_vs)


def test_half_precision_inputs_are_upcast() -> None:
    batch = make_batch(1, 8, 3)
    tensors = {k: torch.as_tensor(v, dtype=torch.bfloat16) for k, v in batch.items()}
    out = vtrace(**tensors)
    assert out.vs.dtype == torch.float32
    rounded = {k: v.float().double().numpy() for k, v in tensors.items()}
    ref_vs, ref_pg = reference_vtrace_sum(**rounded, rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0)
    assert_close(out.vs, ref_vs)
    assert_close(out.pg_advantages, ref_pg)


def test_shape_mismatch_raises() -> None:
    batch = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in make_batch(0, 4, 2).items()}
    with pytest.raises(ValueError, match="bootstrap_value"):
        vtrace(**{**batch, "bootstrap_value": torch.zeros(3)})
    with pytest.raises(ValueError, match="rewards"):
        vtrace(**{**batch, "rewards": torch.zeros(4, 3)})
