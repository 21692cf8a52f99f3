"""Where a user's `module:callable` (--env, --encoder) is looked for: the working directory, as `python -c` has it.

A ground-floor module: it imports nothing from asyncrl.
"""

from __future__ import annotations

import os
import sys


def cwd_on_path() -> None:
    """Put the working directory on `sys.path` (first) unless it is there already, so that a my_env.py or
    my_models.py beside the user imports as `python -c` would import it."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
