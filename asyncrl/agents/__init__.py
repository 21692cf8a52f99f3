"""One home per algorithm (appo/, off_policy/), and what every learner shares: the Learner protocol, the
registry, the acting contract, batch gathering, the optimiser and generator state."""
