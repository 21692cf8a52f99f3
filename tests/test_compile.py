"""--compile: the compiled paths give eager's greedy actions and losses on fixed batches, and really compile.

Most cases compile with dynamo's aot_eager backend (the graphs torch.compile captures, forward and backward, run
op by op: cheap to build); one small case goes through inductor. A counting backend checks that the paths are
captured as graphs and are not captured again on a second call.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounter

from asyncrl.agents.acting import published_actor
from asyncrl.agents.appo.compiled_update import forward_loss
from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.agents.compiled import compile_fn, graph_count
from asyncrl.agents.compiled_acting import CompiledActor, bucket_sizes
from asyncrl.agents.synthetic import synthetic_batch
from asyncrl.config import Config, ConfigError
from asyncrl.envs.base import MASK_KEY, EnvSpec, ObsKey
from asyncrl.models.obs import map_obs
from tests.off_policy_batches import make_batch as sac_batch
from tests.off_policy_batches import make_learner as sac_learner

F32 = np.dtype(np.float32)
VECTOR = EnvSpec("v", (4,), F32, gym.spaces.Discrete(3), 1)
MASKED = EnvSpec("m", (), F32, gym.spaces.Discrete(4), 1,
                 obs_keys=(ObsKey("state", (4,), F32), ObsKey(MASK_KEY, (4,), F32)))
TUPLE = EnvSpec("t", (3,), F32, gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([2, 4]),
                                                   gym.spaces.Box(-1.0, 1.0, (2,), np.float32))), 1)
CASES = {"feed-forward": (VECTOR, "none"), "gru": (VECTOR, "gru"), "lstm": (VECTOR, "lstm"),
         "dict-masked": (MASKED, "none"), "tuple": (TUPLE, "none")}
T, B = 3, 4  # 3 steps: traced, recurrent cores and V-trace run step by step (5: ~1.5 s more CPU over the file)
TOL = {"rtol": 1e-4, "atol": 1e-5}


def appo(spec: EnvSpec, rnn: str) -> APPOLearner:
    cfg = Config(env="null", rnn=rnn, rnn_size=8, hidden_size=8, minibatches=1, epochs=1, lr_schedule="constant",
                 max_policy_lag=100)
    torch.manual_seed(0)
    return APPOLearner(cfg, spec, torch.device("cpu"))


def random_obs(spec: EnvSpec, lead: tuple[int, ...], g: torch.Generator):
    if not spec.is_dict:
        return torch.randn((*lead, *spec.obs_shape), generator=g)
    mask = (torch.rand((*lead, 4), generator=g) < 0.5).float()
    mask[..., 0] = 1.0  # at least one action allowed
    return {"state": torch.randn((*lead, 4), generator=g), MASK_KEY: mask}


def random_batch(learner: APPOLearner, seed: int = 1):
    spec, g = learner.spec, torch.Generator().manual_seed(seed)
    mb = synthetic_batch(spec, T, B, torch.device("cpu"))
    mb.obs = random_obs(spec, (T + 1, B), g)
    with torch.no_grad():
        out, _ = learner.model(map_obs(mb.obs, lambda x: x[:T].flatten(0, 1)))
        dist = learner.model.distribution(out)
        actions = dist.sample()
        mb.behaviour_logp = (dist.log_prob(actions) + 0.1 * torch.randn(T * B, generator=g)).reshape(T, B)
    mb.actions = actions.reshape(T, B, *spec.action_shape)
    mb.rewards = torch.randn(T, B, generator=g)
    mb.terminated = torch.rand(T, B, generator=g) < 0.25  # episode starts inside the trajectories
    mb.terminated[0, 0] = True  # at least one, whatever the draws
    mb.first = torch.cat([torch.zeros(1, B, dtype=torch.bool), mb.terminated])
    if learner.model.state_layout() if hasattr(learner.model, "state_layout") else {}:
        mb.initial_state = {k: v + torch.randn(v.shape, generator=g) for k, v in learner.model.initial_state(B).items()}
    return mb


def losses_and_grads(learner: APPOLearner, mb, pure: bool):
    mask = mb.trainable(learner.cfg.max_policy_lag)
    forward = learner._pure_forward if pure else learner._eager_forward
    loss, stats = forward(mb, mask, 1.0, None)
    learner.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return loss.detach(), {k: v.detach() for k, v in stats.items()}, [p.grad.clone() for p in learner.model.parameters()
                                                                     if p.grad is not None]


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_update_gives_eagers_loss_and_gradients(case: str) -> None:
    learner = appo(*CASES[case])
    mb = random_batch(learner)
    loss, stats, grads = losses_and_grads(learner, mb, pure=False)
    learner.forward_loss = compile_fn(forward_loss, backend="aot_eager")
    c_loss, c_stats, c_grads = losses_and_grads(learner, mb, pure=True)
    torch.testing.assert_close(c_loss, loss, **TOL)
    for k in stats:
        torch.testing.assert_close(c_stats[k], stats[k], **TOL)
    assert len(grads) == len(c_grads) > 0
    for a, b in zip(c_grads, grads):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_act_gives_eagers_greedy_actions_on_padded_requests(case: str) -> None:
    learner = appo(*CASES[case])
    model, g = learner.model.eval(), torch.Generator().manual_seed(2)
    actor = CompiledActor(model, learner.spec, rows_per_split=4, max_splits=2, backend="eager")  # capture only
    n = 6  # padded to 8
    obs, first = random_obs(learner.spec, (n,), g), torch.rand(n, generator=g) < 0.5
    state = {k: torch.randn(v.shape, generator=g) for k, v in actor.initial_state(n).items()}
    eager = published_actor(model)
    want, want_logp, want_state = eager.act(obs, state, first if state else None, greedy=True)
    got, got_logp, got_state = actor.act(obs, state, first, greedy=True)
    torch.testing.assert_close(got, want, **TOL)  # indices exactly; a Tuple's Box means to float rounding
    torch.testing.assert_close(got_logp, want_logp, **TOL)
    for k in want_state:
        torch.testing.assert_close(got_state[k], want_state[k], **TOL)
    sampled, logp, _ = actor.act(obs, state, first)  # sampled: shapes and finite log-probs
    assert sampled.shape == want.shape and torch.isfinite(logp).all()


def test_the_paths_are_captured_as_graphs_once() -> None:
    """A path that silently ran eager (a skipped frame, a fallback) would leave the counters at 0; a recompile per
    call would raise them on the second call."""
    learner = appo(VECTOR, "gru")
    mb = random_batch(learner)
    counter = CompileCounter()
    learner.forward_loss = compile_fn(forward_loss, backend=counter)
    for _ in range(2):
        losses_and_grads(learner, mb, pure=True)
    assert counter.frame_count == 1 and counter.op_count > 10
    acting = CompileCounter()
    actor = CompiledActor(learner.model.eval(), VECTOR, rows_per_split=4, max_splits=3, backend=acting)
    assert actor.sizes == bucket_sizes(4, 3) == [4, 8, 12]
    actor.warm_up()
    frames = acting.frame_count
    assert frames == 1  # one graph, the row count dynamic
    for n in (3, 4, 7, 12):  # every request size maps onto a graph already compiled
        actor.act(torch.randn(n, 4), actor.initial_state(n), torch.zeros(n, dtype=torch.bool))
    assert acting.frame_count == frames


@pytest.mark.parametrize(("rnn", "normalize_obs"), [("none", False), ("gru", False), ("none", True)])
def test_the_warm_up_compiles_the_graph_real_minibatches_take(rnn: str, normalize_obs: bool) -> None:
    """--compile learner warms up on a zero minibatch; the run's minibatches are column views of a whole batch
    (other strides), recurrent, carry their stored initial states, and normalised, come prepared once a batch:
    they must find that graph, not compile another (a cold recompile of a GRU on Pong took as long as the
    warm-up: 123 s)."""
    cfg = Config(env="null", rnn=rnn, rnn_size=8, hidden_size=8, rollout=T, workers=1, envs_per_worker=2 * B,
                 worker_splits=1, batch_size=T * 2 * B, minibatches=2, epochs=1, lr_schedule="constant",
                 max_policy_lag=100, normalize_obs=normalize_obs)
    torch.manual_seed(0)
    learner = APPOLearner(cfg, VECTOR, torch.device("cpu"))
    counter = CompileCounter()
    learner.compiled, learner.forward_loss = True, compile_fn(forward_loss, backend=counter)
    learner.warm_up()
    assert counter.frame_count == 1
    batch = random_batch(learner)  # T x B: columns of a 2B batch's layout below
    whole = synthetic_batch(VECTOR, T, 2 * B, torch.device("cpu"), learner.model.state_layout() if rnn != "none"
                            else None)
    for name in ("obs", "actions", "behaviour_logp", "rewards", "terminated", "first"):
        getattr(whole, name)[:, :B] = getattr(batch, name)
        getattr(whole, name)[:, B:] = getattr(batch, name)
    whole.truncated[:] = False
    for k, v in (batch.initial_state or {}).items():
        whole.initial_state[k][:B] = v
        whole.initial_state[k][B:] = v
    learner.train(whole, frames=0)
    assert counter.frame_count == 1  # both minibatches ran the warm-up's graph


def test_inductor_compiles_a_small_policy_to_eagers_greedy_actions() -> None:
    learner = appo(VECTOR, "none")
    model = learner.model.eval()
    before = graph_count()
    actor = CompiledActor(model, VECTOR, rows_per_split=8, max_splits=1)
    obs = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
    got, got_logp, _ = actor.act(obs, {}, None, greedy=True)
    want, want_logp = model.greedy(obs)
    assert graph_count() > before  # inductor really compiled it
    assert torch.equal(got, want)
    torch.testing.assert_close(got_logp, want_logp, **TOL)


def test_compiled_sac_update_gives_eagers_losses() -> None:
    results = []
    for compiled in (False, True):
        torch.manual_seed(0)
        learner = sac_learner("sac", compile="learner" if compiled else "none")
        if compiled:  # aot_eager: the same random draws as eager, in the same order
            from asyncrl.agents.off_policy.sac_compiled import actor_loss_fn, critic_loss_fn

            learner.critic_loss_fn = compile_fn(critic_loss_fn, backend="aot_eager")
            learner.actor_loss_fn = compile_fn(actor_loss_fn, backend="aot_eager")
        learner.insert(sac_batch(seed=4))
        _, tensors = learner._sample()
        torch.manual_seed(5)
        stats, td_abs = learner._update(tensors)
        results.append((stats, td_abs, [p.detach().clone() for p in learner.model.parameters()]))
    (stats, td, params), (c_stats, c_td, c_params) = results
    assert set(stats) == set(c_stats)
    for k in stats:
        assert c_stats[k] == pytest.approx(stats[k], rel=1e-4, abs=1e-5), k
    torch.testing.assert_close(c_td, td, **TOL)
    for a, b in zip(c_params, params):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("settings, message", [
    ({"compile": "bogus"}, "--compile must be one of none, inference, learner, all"),
    ({"compile": "all", "compile_mode": "fast"}, "--compile-mode must be one of"),
    ({"compile": "learner", "algo": "td3", "env": "Pendulum-v1"}, "--compile covers appo and sac"),
    ({"compile": "inference", "algo": "sac", "env": "Pendulum-v1"}, "sac compiles its updates only"),
    ({"compile": "all", "compile_mode": "reduce-overhead", "device": "cpu"}, "needs --device cuda"),
    ({"precision": "fp8"}, "--precision must be auto, fp32, bf16 or bf16-all"),
])
def test_bad_compile_settings_are_one_line(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("-", r"\-")):
        Config(**{"env": "CartPole-v1", **settings}).resolve().validate()


def test_a_compiled_cpu_learner_takes_every_core_with_batched_envs_unless_told() -> None:
    from asyncrl.runtime.host.cpus import default_learner_threads
    from asyncrl.runtime.stages.learner_state import learner_threads

    cpu = torch.device("cpu")
    assert learner_threads(Config(compile="learner"), cpu, batched=True) == default_learner_threads("cpu", 0)
    assert learner_threads(Config(compile="learner"), cpu) == default_learner_threads("cpu", 1)  # per-env workers
    assert learner_threads(Config(), cpu, batched=True) == default_learner_threads("cpu", 1)  # eager
    assert learner_threads(Config(compile="all", learner_threads=1), cpu, batched=True) == 1


def test_a_graph_break_is_a_one_line_compile_error_not_a_silent_fallback() -> None:
    from asyncrl.agents.compiled import CompileError, first_call

    def breaks(x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return x + 1

    compiled = compile_fn(breaks, backend="eager")
    with pytest.raises(CompileError, match="^--compile: torch.compile cannot take a test function") as info:
        first_call("a test function", lambda: compiled(torch.zeros(2)))
    assert "\n" not in str(info.value)


def test_the_bench_record_reads_the_compile_time_from_the_trainers_log() -> None:
    from asyncrl.bench.trainer import compile_seconds

    log = ("asyncrl: compiling the learner's update (cache /c)...\nasyncrl: learner's update compiled in 21.4 s\n"
           "asyncrl: policy worker 0: act compiled in 3.5 s\nasyncrl: policy worker 1: act compiled in 9.9 s\n")
    assert compile_seconds(log) == 24.9  # the learner and one policy worker (they compile side by side)
    assert compile_seconds("first frames 2.1 s after start\n") is None
