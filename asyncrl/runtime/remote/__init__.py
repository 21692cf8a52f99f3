"""The Ray transport: remote actor groups feeding the learner (docs/ray.md)."""
