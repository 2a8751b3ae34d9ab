"""gagar.trainer.model."""
