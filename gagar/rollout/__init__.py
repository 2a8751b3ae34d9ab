"""Rollouts: the agent loop, task environments, inference engines and weight sync."""
