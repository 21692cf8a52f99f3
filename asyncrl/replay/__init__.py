"""Off-policy replay: a ring buffer, prioritized sampling, sharding and a sample-to-insert rate limiter.

Pure components, independent of the engine; see docs/off-policy.md.
"""
