"""asyncrl's version (setup.cfg's), for `asyncrl.__version__` and the commands' `--version`."""

__version__ = "0.1.0"
