"""This process on this machine: devices, thread counts and seeds."""
