"""Reward functions, their runner (timeouts, isolation) and the code sandbox."""
