"""`python -m asyncrl.train`: the same as `asyncrl-train` (for `torchrun -m asyncrl.train`)."""

from asyncrl.cli.console import exit_now
from asyncrl.cli.train import main

if __name__ == "__main__":
    exit_now(main())
