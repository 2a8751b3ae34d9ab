"""The Kubernetes operator: kopf handlers (I/O) over pure builders and a pure status calculator.

Layout:

* ``builders/`` (pure): ``build_all(run, BuildContext(uid, crds, attempt, state)) -> [manifest]``
  and one ``build_<kind>`` per child. ``gagar render RUN.yaml`` prints the same objects.
* ``observe.py`` (pure): raw child objects -> ``Observed`` facts (Job/JobSet, Deployments,
  trainer progress, pod waiting reasons).
* ``status.py`` (pure): ``compute_status(spec, observed, previous, now) -> Outcome`` (status,
  trainer attempt, terminal flag, events); ``set_condition`` keeps ``lastTransitionTime``.
* ``handlers.py`` (kopf): ``Reconciler`` + ``register(registry, reconciler)``; ``kube.py`` is the
  REST layer (server-side apply under the ``gagar-operator`` field manager); ``main.py`` runs
  ``gagar operator``.

Contract with the trainer: rank 0 reports progress by patching the ConfigMap ``<run>-progress``
(its Role allows exactly that), string values under ``step``, ``policyVersion``,
``rolloutPolicyVersion``, ``checkpointStep``, ``checkpointUri``, ``checkpointTime``,
``startTime``; it reads its validated spec from ``/etc/gagar/config/*.json``; it exits with code
3 (``EXIT_PERMANENT``) when retrying cannot help. Pods never patch the GagarRun.
"""
