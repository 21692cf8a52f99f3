"""Learners: what the learner process trains (one module per algorithm, chosen by `--algo`; see registry.py)."""
