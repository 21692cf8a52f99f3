"""V-trace off-policy value targets and policy-gradient advantages.

Reference: Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance
Weighted Actor-Learner Architectures", section 4.1 (eq. 1 and the policy-gradient term of
section 4.2).

All tensors are time-major: ``[T, B]`` (extra trailing batch dimensions are also accepted,
as long as every input agrees). ``bootstrap_value`` is ``V(x_T)`` with shape ``[B]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["VTraceReturns", "vtrace"]


@dataclass
class VTraceReturns:
    """Outputs of :func:`vtrace` (all float32, detached, time-major)."""

    vs: torch.Tensor  # [T, B] value targets v_s
    pg_advantages: torch.Tensor  # [T, B] rho^pg_s * (r_s + discount_s * v_{s+1} - V(x_s))
    rhos: torch.Tensor  # [T, B] unclipped importance ratios pi(a_s|x_s) / mu(a_s|x_s)


def _check_shapes(values: torch.Tensor, bootstrap_value: torch.Tensor, **like_values: torch.Tensor) -> None:
    """ValueError unless `values` is time-major, every tensor of `like_values` has its shape and `bootstrap_value`
    has its shape without the time dimension."""
    shape = values.shape
    if values.dim() < 1 or shape[0] < 1:
        raise ValueError(f"values must be time-major with T >= 1, got shape {tuple(shape)}")
    for name, t in like_values.items():
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} (like values)")
    if bootstrap_value.shape != shape[1:]:
        raise ValueError(
            f"bootstrap_value has shape {tuple(bootstrap_value.shape)}, expected {tuple(shape[1:])}"
        )


def vtrace(
    behaviour_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    discounts: torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = None,
) -> VTraceReturns:
    """Compute V-trace targets (IMPALA eq. 1) with the backward recursion of Espeholt et al. 2018.

    With ``rho_s = min(rho_bar, pi/mu)``, ``c_s = min(c_bar, pi/mu)`` and
    ``delta_s = rho_s * (r_s + discount_s * V(x_{s+1}) - V(x_s))``::

        v_s - V(x_s) = delta_s + discount_s * c_s * (v_{s+1} - V(x_{s+1})),   v_T - V(x_T) = 0

    which equals the n-step sum of eq. 1 with ``gamma^{t-s}`` generalised to the product of
    per-step discounts. The policy-gradient advantage (section 4.2) is
    ``min(pg_rho_bar, pi/mu) * (r_s + discount_s * v_{s+1} - V(x_s))`` with ``v_T = V(x_T)``.

    Args:
        behaviour_logp: ``log mu(a_s|x_s)`` of the acting policy, ``[T, B]``.
        target_logp: ``log pi(a_s|x_s)`` of the learner policy, ``[T, B]``.
        rewards: ``r_s``, ``[T, B]``.
        values: ``V(x_s)`` for ``s = 0..T-1``, ``[T, B]``.
        bootstrap_value: ``V(x_T)``, ``[B]``.
        discounts: ``gamma * (1 - done_s)`` where ``done_s`` means the episode ended after
            action ``s``, ``[T, B]``.
        rho_bar: truncation of the importance weights in ``delta_s`` (defines the fixed point).
        c_bar: truncation of the trace coefficients ``c_s`` (controls contraction speed).
        pg_rho_bar: truncation for the policy-gradient importance weight; defaults to ``rho_bar``.

    Returns:
        :class:`VTraceReturns` of float32 tensors on the inputs' device, without autograd history.
    """
    _check_shapes(values, bootstrap_value, behaviour_logp=behaviour_logp, target_logp=target_logp, rewards=rewards,
                  discounts=discounts)
    if pg_rho_bar is None:
        pg_rho_bar = rho_bar

    with torch.no_grad():
        f32 = torch.float32
        behaviour_logp = behaviour_logp.detach().to(f32)
        target_logp = target_logp.detach().to(f32)
        rewards = rewards.detach().to(f32)
        values = values.detach().to(f32)
        bootstrap_value = bootstrap_value.detach().to(f32)
        discounts = discounts.detach().to(f32)

        rhos = torch.exp(target_logp - behaviour_logp)
        clipped_rhos = torch.clamp(rhos, max=rho_bar)
        cs = torch.clamp(rhos, max=c_bar)

        # V(x_{s+1}) for s = 0..T-1, using the bootstrap value for the last step.
        values_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)

        # Backward recursion on v_s - V(x_s); the accumulator starts at v_T - V(x_T) = 0. One fused multiply-add
        # per step on rows taken out once: the loop is T small operations, not 5T (each costs microseconds).
        delta_rows, trace_rows = deltas.unbind(0), (discounts * cs).unbind(0)
        acc = torch.zeros_like(bootstrap_value)
        steps = []
        for s in range(values.shape[0] - 1, -1, -1):
            acc = torch.addcmul(delta_rows[s], trace_rows[s], acc)
            steps.append(acc)
        vs = values + torch.stack(steps[::-1])

        vs_tp1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
        clipped_pg_rhos = torch.clamp(rhos, max=pg_rho_bar)
        pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_tp1 - values)

    return VTraceReturns(vs=vs, pg_advantages=pg_advantages, rhos=rhos)
