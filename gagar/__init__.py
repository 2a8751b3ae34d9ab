"""gagar: Groupwise Agentic Grading and Advantage Redistribution — RL for code agents.

Components live under this package: ``spec`` (the GagarRun schema), ``operator`` (kopf),
``trainer`` (Megatron-Core policy, GAGAR math, loss, driver), ``rollout`` (agent loop, environments,
engines), ``sandbox`` (isolated executors) and ``grader`` (agentic and heuristic graders).
"""

__version__ = "0.1.0"

API_GROUP = "gagar.dev"
API_VERSION = "v1alpha1"
KIND = "GagarRun"
# The key of the whole validated run in the operator's ``<run>-config`` ConfigMap, mounted at every
# component's ``--config-dir``.
RUN_FILE = "run.json"
# Beside it there (``sandbox.backend: pods`` with task environments): each environment's executor
# pool, ``{"<environment>": "http://<its headless Service>:<port>"}``.
SANDBOX_POOLS_FILE = "sandbox-pools.json"
