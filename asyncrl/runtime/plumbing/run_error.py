"""How a run that cannot go on says so: `RunError` (one line for the user) and which checkpoint remains."""

from __future__ import annotations

import os

from asyncrl.runtime.store.checkpoint import checkpoint_dir, list_checkpoints


class RunError(RuntimeError):
    """The run could not continue (a component died or failed); message is for the user.

    Unless `hint` is False, the runner adds which checkpoint remains once the shutdown (and with it the
    learner's final save) is over. `exit_code` is the run's: 1, or 2 for bad input found while running.
    """

    def __init__(self, message: str, hint: bool = True, exit_code: int = 1) -> None:
        super().__init__(message)
        self.hint = hint
        self.exit_code = exit_code


def checkpoint_hint(run_dir: str, final: dict | None = None) -> str:
    """Which checkpoint of the run remains; `final`: the "saved" report of a save at this stop, if any."""
    if final:
        return (f"The learner saved a final checkpoint, {os.path.basename(final['path'])} (policy version "
                f"{final['version']}), in {checkpoint_dir(run_dir)}; continue with --resume")
    found = list_checkpoints(run_dir)
    if not found:
        return "No checkpoint had been saved."
    return (f"The last good checkpoint, {os.path.basename(found[0])}, is kept in {checkpoint_dir(run_dir)}; "
            f"continue with --resume")


__all__ = ["RunError", "checkpoint_hint"]
