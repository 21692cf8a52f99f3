"""Populations of policies trained together (`--num-policies`): population-based training (`pbt.py`)."""
