"""gagar.rollout.envs."""
