"""`asyncrl-train`: parse the command line, validate it, run the trainer."""

from __future__ import annotations

import sys

from asyncrl.config import ConfigError, parse_config, resume_changes
from asyncrl.envs.base import EnvError
from asyncrl.runtime import distributed


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_config(argv)
        cfg.validate()
        for change in resume_changes(cfg):  # settings the command line changed from the saved run's
            print(change, flush=True)
        if cfg.device.startswith("cuda"):
            _require_cuda()
        distributed.configure(cfg)  # under torchrun: this rank's seed, device, run dir (no-op otherwise)
        from asyncrl.runtime.runner import Runner

        runner = Runner(cfg)
        print(f"asyncrl: {cfg.env} -> {cfg.run_dir} | {cfg.workers} workers x {cfg.envs_per_worker} envs, "
              f"{cfg.policy_workers} policy worker(s), batch {cfg.batch_size}, rollout {cfg.rollout}", flush=True)
        return runner.run()
    except (ConfigError, EnvError) as exc:
        print(f"asyncrl-train: error: {exc}", file=sys.stderr)
        return 2


def _require_cuda() -> None:
    import subprocess

    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    if subprocess.run([sys.executable, "-c", probe]).returncode:
        raise ConfigError("--device cuda: no CUDA device is available; use --device auto or cpu")


if __name__ == "__main__":
    sys.exit(main())
