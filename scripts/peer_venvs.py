"""Build the peers that scripts/time_to_score.py and `asyncrl-bench --sf2-python` run: Sample Factory 2 and
CleanRL's PPO Atari script, each in a virtual environment of its own (they pin gymnasium 0.29 and numpy < 2).

  DIR/sf2venv       sample-factory 2.1.1 with vizdoom (its Atari and Doom examples)
  DIR/cleanrlvenv   CleanRL's ppo_atari.py requirements at versions that install on Python 3.11
  DIR/cleanrl_src   cleanrl/ppo_atari.py and cleanrl_utils/ from CleanRL's repository at commit CLEANRL_COMMIT,
                    unmodified (PyPI's cleanrl 0.4.8 carries an older ppo_atari.py that needs gym and pybullet)

Both venvs get torch from TORCH_SPEC (as the Makefile: a CPU build where pip is configured with one) and a
one-line `ale_py_register.pth` (`import ale_py`): ale-py 0.9 registers its envs with gymnasium only when
imported, which neither peer does. A venv or source folder that is already complete is kept.

    .venv/bin/python scripts/peer_venvs.py peers                        # clones CleanRL from GitHub
    .venv/bin/python scripts/peer_venvs.py peers --cleanrl-src ~/cleanrl  # or takes a local checkout
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

CLEANRL_REPO = "https://github.com/vwxyzjn/cleanrl"
CLEANRL_COMMIT = "fe8d8a0"
COMMON = ["gymnasium==0.29.1", "ale-py==0.9.1", "numpy<2"]
PEERS = {
    "sf2venv": (["sample-factory==2.1.1", "vizdoom>=1.3.2,<1.4", *COMMON], "sf_examples.atari.train_atari, vizdoom"),
    "cleanrlvenv": ([*COMMON, "opencv-python-headless", "tensorboard", "tyro"], "cv2, tyro, torch.utils.tensorboard"),
}
REGISTER = "ale_py_register.pth"


def run(cmd: list[str], dry_run: bool) -> None:
    print("+ " + shlex.join(cmd), flush=True)
    if not dry_run:
        subprocess.run(cmd, check=True)


def complete(venv: Path, imports: str) -> bool:
    """Whether `venv` imports what its peer needs, ale-py's envs registered by the .pth included."""
    python = venv / "bin" / "python"
    probe = f"import {imports}; import gymnasium; gymnasium.spec('PongNoFrameskip-v4')"
    return python.exists() and subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def build_venv(venv: Path, packages: list[str], torch_spec: str, torch_index: str | None, dry_run: bool) -> None:
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "venv", str(venv)], dry_run)
    pip = [str(python), "-m", "pip", "install", "-q"]
    # torch first, from TORCH_INDEX when given: a plain install of a peer would pull torch's CUDA build (GiBs).
    run([*pip, *(["--index-url", torch_index] if torch_index else []), torch_spec], dry_run)
    run([*pip, *packages], dry_run)
    site = "import site; print(site.getsitepackages()[0])"
    if dry_run:
        print(f"+ echo 'import ale_py' > {venv}/lib/python3.X/site-packages/{REGISTER}")
        return
    site_packages = subprocess.run([str(python), "-c", site], capture_output=True, text=True, check=True).stdout
    (Path(site_packages.strip()) / REGISTER).write_text("import ale_py\n")


def cleanrl_source(dest: Path, checkout: Path | None, dry_run: bool) -> None:
    """cleanrl/ppo_atari.py and cleanrl_utils/ at CLEANRL_COMMIT into `dest` (from `checkout`, else a clone)."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = checkout
        if repo is None:
            repo = Path(tmp) / "cleanrl"
            run(["git", "clone", "--quiet", CLEANRL_REPO, str(repo)], dry_run)
        part = dest.with_name(dest.name + ".part")
        archive = ["git", "-C", str(repo), "archive", CLEANRL_COMMIT, "cleanrl/ppo_atari.py", "cleanrl_utils"]
        print("+ " + shlex.join(archive) + " | tar -x -C " + shlex.quote(str(part)), flush=True)
        if not dry_run:
            part.mkdir(parents=True, exist_ok=True)
            tar = subprocess.run(archive, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(part)], input=tar, check=True)
            part.rename(dest)  # only a whole copy gets the final name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="peer_venvs", description=__doc__.split("\n\n", 1)[0])
    p.add_argument("dir", type=Path, help="folder for sf2venv/, cleanrlvenv/ and cleanrl_src/")
    p.add_argument("--cleanrl-src", type=Path, help="a clone of CleanRL, bare or not (default: clone it from GitHub)")
    p.add_argument("--torch-spec", default=os.environ.get("TORCH_SPEC", "torch==2.13.0"))
    p.add_argument("--torch-index", default=os.environ.get("TORCH_INDEX") or None)
    p.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    args = p.parse_args(argv)
    probe = ["git", "-C", str(args.cleanrl_src), "cat-file", "-e", f"{CLEANRL_COMMIT}^{{commit}}"]
    if args.cleanrl_src is not None and subprocess.run(probe, capture_output=True).returncode != 0:
        print(f"peer_venvs: --cleanrl-src {args.cleanrl_src} has no commit {CLEANRL_COMMIT}: give a "
              f"clone of {CLEANRL_REPO}", file=sys.stderr)
        return 2
    if not args.dry_run:
        args.dir.mkdir(parents=True, exist_ok=True)
    try:
        for name, (packages, imports) in PEERS.items():
            venv = args.dir.resolve() / name
            if complete(venv, imports):
                print(f"{venv}: complete, kept")
                continue
            build_venv(venv, packages, args.torch_spec, args.torch_index, args.dry_run)
        src = args.dir.resolve() / "cleanrl_src"
        if (src / "cleanrl" / "ppo_atari.py").exists():
            print(f"{src}: complete, kept")
        else:
            cleanrl_source(src, args.cleanrl_src, args.dry_run)
    except subprocess.CalledProcessError as e:
        print(f"peer_venvs: {shlex.join(map(str, e.cmd))} failed with exit status {e.returncode}", file=sys.stderr)
        return 1
    except OSError as e:  # git, tar or the folder itself
        print(f"peer_venvs: {e}", file=sys.stderr)
        return 1
    d = args.dir
    print(f"time_to_score flags: --sf2-python {d}/sf2venv/bin/python --cleanrl-python {d}/cleanrlvenv/bin/python "
          f"--cleanrl-script {d}/cleanrl_src/cleanrl/ppo_atari.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
