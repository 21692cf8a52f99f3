"""The replay learners: one shared learner loop with SAC, TD3 and REDQ on top, and their losses."""
