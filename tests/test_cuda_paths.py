"""The CUDA paths, checked without a GPU: tensors placed on the `meta` device stand for a second device, the
CUDA driver is detected by its library mapped into the process, and the CUDA-only switches are read back.
`scripts/gpu_check.sh` runs the same paths on a real GPU."""

from __future__ import annotations

import configparser
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.agents.registry import make_learner
from asyncrl.algo.moment_sync import MomentSync, moment_modules
from asyncrl.bench.report import markdown
from asyncrl.bench.sample_factory import sf2_command
from asyncrl.bench.settings import BenchSettings
from asyncrl.bench.suite import add_ratios, command
from asyncrl.cli.bench import build_parser, settings_from
from asyncrl.config import Config, default_workers
from asyncrl.diagnostics.resources import GpuSampler, gpu_ids
from asyncrl.envs.registry import make_env_spec
from asyncrl.launch import ForkError, check_can_fork, cuda_driver_loaded
from asyncrl.policy import PolicyHead, module_device, restore_policy
from asyncrl.runtime.distributed.group import NCCL_ERROR_ENV, nccl_error_environment
from asyncrl.runtime.host.cpus import default_learner_threads
from asyncrl.runtime.host.devices import configure_cuda_backends
from asyncrl.runtime.roles.learner import learner_threads, read_resume_state
from asyncrl.runtime.store.checkpoint import save_checkpoint
from asyncrl.system import cgroup_cpu_limit, usable_cpus

ROOT = Path(__file__).resolve().parents[1]
META = torch.device("meta")


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _tensors(v)


def _one_adam_step(learner: APPOLearner) -> None:
    loss = sum(p.square().sum() for p in learner.model.parameters())
    loss.backward()
    learner.optimizer.step()


def test_resume_reads_on_the_cpu_and_load_state_dict_places_tensors(tmp_path) -> None:
    """A checkpoint resumed by a learner on another device: the RNG states stay CPU byte tensors (set_rng_state
    takes nothing else), Adam's moments follow the parameters, and so do its step counters where the update is fused
    (torch's per-tensor update keeps them on the CPU)."""
    cfg = Config(env="CartPole-v1", normalize_obs=True, normalize_returns=True, train_dir=str(tmp_path))
    spec = make_env_spec("CartPole-v1")
    trained = APPOLearner(cfg, spec, torch.device("cpu"))
    _one_adam_step(trained)
    save_checkpoint(cfg.run_dir, 1, {"learner": trained.state_dict(), "env_steps": 10, "config": cfg.to_json()}, 2)
    expected = torch.rand(4)  # the draws that follow the saved generator state

    _, state = read_resume_state(cfg.run_dir, warn=pytest.fail)
    assert {t.device.type for t in _tensors(state)} == {"cpu"}
    elsewhere = APPOLearner(cfg, spec, META)
    torch.rand(7)  # move the generator on: the restore must bring it back
    elsewhere.load_state_dict(state["learner"])
    assert torch.equal(torch.rand(4), expected)
    adam = next(iter(elsewhere.optimizer.state.values()))
    fused = elsewhere.optimizer.defaults["fused"]
    assert adam["step"].device == (META if fused else torch.device("cpu")) and adam["exp_avg"].device == META
    assert elsewhere.return_normalizer.moments.mean.device == META


def test_return_normaliser_lives_beside_the_observation_normaliser() -> None:
    """The ranks pool both normalisers' moments in one vector (MomentSync.delta concatenates them)."""
    cfg = Config(env="CartPole-v1", normalize_obs=True, normalize_returns=True)
    learner = APPOLearner(cfg, make_env_spec("CartPole-v1"), META)
    assert learner.return_normalizer.moments.count.device == META
    delta = MomentSync(moment_modules(learner.model, learner.return_normalizer)).delta()
    assert delta.device == META and delta.numel() == (1 + 4 + 4) + (1 + 1 + 1)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1", "tests.custom_env:SignMatch"])
def test_policy_head_buffers_are_on_the_models_device(env: str) -> None:
    """No normaliser (CartPole), action bounds (Pendulum), Dict observations: every buffer where the model is."""
    spec = make_env_spec(env)
    model = APPOLearner.build_policy(spec, Config(env=env), META)
    head = PolicyHead(model, spec)
    assert {t.device for t in (*head.parameters(), *head.buffers())} == {META}
    assert module_device(head) == META
    on_cpu = PolicyHead(APPOLearner.build_policy(spec, Config(env=env), torch.device("cpu")), spec)
    moved = on_cpu.to(META)
    assert {t.device for t in (*moved.parameters(), *moved.buffers())} == {META}


@pytest.mark.parametrize("algo, env", [("appo", "Pendulum-v1"), ("appo", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_restore_policy_puts_the_whole_head_on_the_device_asked(algo: str, env: str) -> None:
    """What load_policy(device=...) and asyncrl-enjoy --device do with a checkpoint read on the CPU."""
    cfg = Config(env=env, algo=algo, replay_size=1000)
    spec = make_env_spec(env)
    learner = make_learner(cfg, spec, torch.device("cpu"))
    state = {"config": cfg.to_json(), "learner": learner.state_dict()}
    run = restore_policy(state, "ckpt", spec, "meta")
    assert {t.device for t in (*run.head.parameters(), *run.head.buffers())} == {META}


def test_a_loaded_cuda_driver_refuses_the_fork(tmp_path) -> None:
    """torch.cuda.is_available() maps libcuda.so without setting is_initialized(): the mapping is the sign."""
    fake = tmp_path / "libcuda.so.1"
    fake.write_bytes(b"\0" * mmap.PAGESIZE)
    assert not cuda_driver_loaded()
    with open(fake, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ):
        assert cuda_driver_loaded()
        with pytest.raises(ForkError, match="PYTORCH_NVML_BASED_CUDA_CHECK=1"):
            check_can_fork()
    assert not cuda_driver_loaded()


ENV_THAT_LOADS_CUDA = '''
import mmap, os
import gymnasium as gym

_KEEP = []

def make():
    """Maps a file named like the CUDA driver, as an env calling torch.cuda.is_available() would."""
    path = os.path.join(os.path.dirname(__file__), "libcuda.so.1")
    with open(path, "wb") as f:
        f.write(b"\\0" * mmap.PAGESIZE)
    f = open(path, "rb")
    _KEEP.append((f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)))
    return gym.make("CartPole-v1")
'''


def test_an_env_that_loads_cuda_when_built_is_refused_in_one_line(tmp_path) -> None:
    (tmp_path / "cuda_env.py").write_text(ENV_THAT_LOADS_CUDA)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cli.train", "--env", "cuda_env:make", "--device", "cpu",
                           "--train-dir", str(tmp_path / "runs"), "--frames", "1000"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    # Parsing the command line already builds the env (presets, memory checks): the fork check then refuses
    # with the line naming both causes; an env first built by the runner gets `check_env_left_cuda_alone`'s.
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "env factory" in lines[0] and "PYTORCH_NVML_BASED_CUDA_CHECK=1" in lines[0]


def test_cgroup_quota_and_usable_cpus(tmp_path) -> None:
    v2 = tmp_path / "cpu.max"
    v2.write_text("max 100000\n")
    assert cgroup_cpu_limit(str(v2), "/nonexistent", "/nonexistent") is None
    v2.write_text("150000 100000\n")
    assert cgroup_cpu_limit(str(v2), "/nonexistent", "/nonexistent") == 1.5
    quota, period = tmp_path / "quota", tmp_path / "period"
    quota.write_text("400000\n")
    period.write_text("100000\n")
    assert cgroup_cpu_limit("/nonexistent", str(quota), str(period)) == 4.0
    quota.write_text("-1\n")
    assert cgroup_cpu_limit("/nonexistent", str(quota), str(period)) is None
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))


def test_thread_and_worker_defaults_follow_device_and_ranks(monkeypatch) -> None:
    assert default_learner_threads("cpu", 1, cpus=16, ranks=1) == 15
    assert default_learner_threads("cuda", 1, cpus=16, ranks=1) == 4  # not 15 threads spinning beside 16 workers
    assert default_learner_threads("cuda", 1, cpus=224, ranks=8) == 4
    assert default_learner_threads("cpu", 1, cpus=224, ranks=8) == 27
    assert default_learner_threads("cuda", 1, cpus=2, ranks=1) == 1
    assert learner_threads(Config(learner_threads=3), torch.device("cuda")) == 3
    assert learner_threads(Config(deterministic=True), torch.device("cuda")) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    alone = default_workers()
    assert alone == max(2, 2 * usable_cpus())
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # torchrun --nproc-per-node 8: the node's cores are shared
    assert default_workers() == max(2, 2 * usable_cpus() // 8)
    assert Config().workers == default_workers()


def test_cudnn_autotuner_and_tf32_for_cuda_training_only() -> None:
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    try:
        torch.backends.cudnn.benchmark = torch.backends.cuda.matmul.allow_tf32 = False
        configure_cuda_backends(torch.device("cpu"))
        assert not torch.backends.cudnn.benchmark and not torch.backends.cuda.matmul.allow_tf32
        configure_cuda_backends(torch.device("cuda", 0))
        assert torch.backends.cudnn.benchmark and torch.backends.cudnn.allow_tf32
        assert torch.backends.cuda.matmul.allow_tf32
        configure_cuda_backends(torch.device("cuda"), deterministic=True)
        assert not torch.backends.cudnn.benchmark  # the autotuner's pick may differ between runs
    finally:
        (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32,
         torch.backends.cuda.matmul.allow_tf32) = saved


def test_nccl_errors_raise_in_the_learner_unless_the_user_chose_otherwise() -> None:
    environ: dict[str, str] = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    added = nccl_error_environment(environ)
    assert added == {"TORCH_NCCL_BLOCKING_WAIT": "1"}
    assert environ == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_BLOCKING_WAIT": "1"}
    assert nccl_error_environment({}) == NCCL_ERROR_ENV


def test_gpu_utilisation_is_the_runs_own_gpu(tmp_path, monkeypatch) -> None:
    assert gpu_ids("cpu", {}) == []
    assert gpu_ids("auto", {}) == ["0"] and gpu_ids("cuda", {}) == ["0"] and gpu_ids("cuda:1", {}) == ["1"]
    assert gpu_ids("cuda:1", {"CUDA_VISIBLE_DEVICES": "3,5"}) == ["5"]
    assert gpu_ids("cuda", {"CUDA_VISIBLE_DEVICES": "GPU-abc"}) == ["GPU-abc"]
    assert gpu_ids("auto", {"CUDA_VISIBLE_DEVICES": ""}) == []
    fake = tmp_path / "nvidia-smi"  # 4 GPUs at 10, 20, 30, 40 % busy; --id=N answers for GPU N only
    fake.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in --id=*) id="${a#--id=}";; esac; done\n'
                    'if [ -n "$id" ]; then echo "$(( (id + 1) * 10 )), 100, 1000"; exit 0; fi\n'
                    'for i in 0 1 2 3; do echo "$(( (i + 1) * 10 )), 100, 1000"; done\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert GpuSampler(device="cuda:2").sample()["gpu_util"] == 30.0
    assert GpuSampler().sample()["gpu_util"] == 25.0  # no device: the machine's average
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert GpuSampler(device="auto").binary is None


def test_bench_rows_carry_their_own_device() -> None:
    s = settings_from(build_parser().parse_args(["--mode", "train", "--device", "cpu"]), [])
    assert s.device == "cpu" and s.trainer_args()[-3:] == ["--device", "cpu", "--train"]
    assert command(s)[command(s).index("--device") + 1] == "cpu"
    assert BenchSettings(extra_trainer_args=("--device", "cuda")).trainer_device == "cuda"
    assert "--device=cpu" in sf2_command("python", BenchSettings(env="doom_basic", device="cpu"), "/tmp/x")
    machine = {"cpu_count": 2, "torch": "x", "device": "none", "load_avg_before_suite": [0.1, 0.1, 0.1]}
    base = {"envs_per_worker": 16, "repeats": 3, "window_s": 3.0, "machine": machine, "env": "e", "scaling": False}
    records = [{**base, "mode": m, "workers": 4, "sps": v, "fps": v, "sps_min": v, "sps_max": v, "device": d}
               for m, v, d in [("sampler", 200.0, "cuda"), ("train", 100.0, "cuda"), ("naive", 50.0, "cpu")]]
    rows = add_ratios(records)
    assert rows[0]["train_over_sampler"] == 0.5 and rows[0]["asyncrl_over_naive"] is None  # not like with like
    text = markdown(records, rows)
    assert "| train | 4 x 16 | 100 | 100 | 100-100 (3 x 3 s) | - | - | - | - | cuda |" in text
    assert "| naive | 4 envs (1 process each) | 50 | 50 | 50-50 (3 x 3 s) | - | - | - | - | cpu |" in text
    records[2]["device"] = "cuda"
    assert add_ratios(records)[0]["asyncrl_over_naive"] == 2.0


def test_the_declared_torch_floor_is_the_one_the_code_needs() -> None:
    """torch.serialization.safe_globals (every checkpoint load) arrived in torch 2.5; get_autocast_dtype (bf16
    inference) in 2.4. The floor in setup.cfg says so, and the installed torch meets it."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    spec = next(r for r in parser["options"]["install_requires"].split("\n") if r.strip().startswith("torch"))
    floor = tuple(int(x) for x in spec.split(">=")[1].split(",")[0].split("."))
    assert floor == (2, 5)
    installed = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    assert installed >= floor
    assert callable(torch.serialization.safe_globals) and callable(torch.get_autocast_dtype)
