"""User callbacks of `asyncrl.train(..., callbacks=[...])`, called in the calling process (the runner's).

Each callable gets one dict per event: every metrics record (`event: "metrics"`, the record as written to
metrics.jsonl), every saved checkpoint (`event: "checkpoint"`: `path`, `version`, `env_steps`) and every
evaluation result (`event: "eval"`: the `eval_*` values). Returning `False` stops the run cleanly, as a signal
would (`stop_reason` "callback", with a final checkpoint); any other return value lets it go on. A callback
that raises stops the run with one line naming it. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from asyncrl.runtime.plumbing.run_error import RunError

Callback = Callable[[dict[str, Any]], Any]
EVENTS = ("metrics", "checkpoint", "eval")


def callback_name(fn: Callback) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


class Callbacks:
    def __init__(self, fns: Iterable[Callback] = ()) -> None:
        self.fns = list(fns)
        for fn in self.fns:
            if not callable(fn):
                raise TypeError(f"callbacks must be callables taking one dict, not a {type(fn).__name__}")

    def __bool__(self) -> bool:
        return bool(self.fns)

    def __call__(self, event: str, record: Mapping[str, Any]) -> bool:
        """Call each callback with `record` marked as `event`; False when one asks the run to stop."""
        go_on = True
        for fn in self.fns:
            try:
                answer = fn({**record, "event": event})
            except Exception as exc:
                raise RunError(f"callback {callback_name(fn)} raised {type(exc).__name__}: {exc}; stopping the "
                               f"run") from None
            go_on = go_on and answer is not False
        return go_on
