"""gagar.operator.builders."""
