"""The environment the operator gives a run's pods, and the exit code that fails a run at once.

One source for both sides: the operator's builders write these names
(``gagar.operator.builders``), the cluster trainer reads them (``gagar.driver.cluster``, whose
docstring says what each one holds).
"""

from __future__ import annotations

EXIT_PERMANENT = 3  # a trainer that finds its configuration unusable exits with this

RUN = "GAGAR_RUN"
COMPONENT = "GAGAR_COMPONENT"
CONFIG_DIR = "GAGAR_CONFIG_DIR"
LOG_LEVEL = "GAGAR_LOG_LEVEL"
METRICS_PORT = "GAGAR_METRICS_PORT"
NAMESPACE = "GAGAR_NAMESPACE"
RUN_DIR = "GAGAR_RUN_DIR"
CHECKPOINT_URI = "GAGAR_CHECKPOINT_URI"
ROLLOUT_URL = "GAGAR_ROLLOUT_URL"
ROLLOUT_SERVICE = "GAGAR_ROLLOUT_SERVICE"
ROLLOUT_REPLICA_URLS = "GAGAR_ROLLOUT_REPLICA_URLS"
ROLLOUT_WAIT_SECONDS = "GAGAR_ROLLOUT_WAIT_SECONDS"
WEIGHT_TRANSPORT = "GAGAR_WEIGHT_TRANSPORT"
GRADER_URL = "GAGAR_GRADER_URL"
SANDBOX_URL = "GAGAR_SANDBOX_URL"
SANDBOX_WARMPOOL = "GAGAR_SANDBOX_WARMPOOL"  # isolation agent-sandbox: the pool sessions claim from
MODEL_DIR = "GAGAR_MODEL_DIR"
PROGRESS_CONFIGMAP = "GAGAR_PROGRESS_CONFIGMAP"
AUTH_TOKEN_FILE = "GAGAR_AUTH_TOKEN_FILE"  # the services' shared token (``gagar.auth``)
# vLLM's weight-update routes' token (``rollout.engines.vllm_auth``): the trainer and the rollout
# pool read it from the run's ``<run>-weight-sync`` Secret, which the operator makes
WEIGHT_SYNC_TOKEN = "GAGAR_WEIGHT_SYNC_TOKEN"
# The trainer's weight server (``rollout.engines.weight_http``): the trainer serves its published
# versions there (rank 0, on the URL's port), the rollout pool fetches them from it (and refuses
# any other source); the rollout pods' local copy lives under WEIGHTS_DIR
WEIGHTS_URL = "GAGAR_WEIGHTS_URL"
WEIGHTS_DIR = "GAGAR_WEIGHTS_DIR"
EXIT_PERMANENT_VAR = "GAGAR_EXIT_PERMANENT"
PERMANENT_MARKER = "GAGAR_PERMANENT_MARKER"  # set by the launcher for its workers
