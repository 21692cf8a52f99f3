"""The stop signals of this machine's process groups."""

from __future__ import annotations

import signal

# Signals a terminal, a scheduler or a container manager sends to every process of the group.
GROUP_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
