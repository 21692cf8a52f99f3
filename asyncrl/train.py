"""`python -m asyncrl.train`: the same as `asyncrl-train` (for `torchrun -m asyncrl.train`)."""

import sys

from asyncrl.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
