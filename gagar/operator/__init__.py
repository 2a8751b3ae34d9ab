"""The Kubernetes operator: kopf handlers (I/O) over pure builders and a pure status calculator."""
