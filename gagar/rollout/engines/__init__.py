"""gagar.rollout.engines."""
