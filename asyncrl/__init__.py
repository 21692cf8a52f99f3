"""asyncrl: an asynchronous shared-memory reinforcement-learning trainer."""

__version__ = "0.1.0"
