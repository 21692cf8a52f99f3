"""What a run keeps on disk: checkpoints, the run's metadata and the best evaluated weights."""
