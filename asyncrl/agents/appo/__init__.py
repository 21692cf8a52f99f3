"""APPO: the learner, its loss (PPO clipping on V-trace targets) and its acting head."""
