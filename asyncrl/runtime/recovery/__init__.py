"""Keeping a run alive: the supervisor (restarts, hang and stall rules), env-error guards and queue repair."""
