"""Off-policy replay: a ring buffer and prioritized sampling.

Pure components, independent of the engine; see docs/off-policy.md.
"""
