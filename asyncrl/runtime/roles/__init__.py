"""The engine's processes: the runner and the children it forks (learner, policy workers, rollout workers,
evaluator), and what every child does first."""
