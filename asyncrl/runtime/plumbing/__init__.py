"""What the processes share: trajectory slots, queues, the liveness block, the published weights, the
wiring that lists the processes, and the small records they exchange."""
