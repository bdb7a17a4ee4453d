"""The domain core: every rule of claims and pools that is not about how objects are stored or watched.

Both runtimes, the Kubernetes reconcilers (`corral.operator.reconcile`, the claims API's `kube_backend`) and the
Docker runtime (`corral.operator.docker`), decide from here, so a rule changed here changes in both modes at once:

- `vocabulary`: claim phases and launch types (the resource model's and the claims API's, and the one mapping
  between them), the reasons a claim fails or waits, the pool gauge states;
- `admission`: whether a claim's env and volumes may be applied to its template (the templates' policies);
- `lifecycle`: readiness grace, claim timeout, lease (ttlSeconds / shutdownTime) and ttlSecondsAfterFinished;
- `metrics`: the metrics both runtimes export, with one set of names and labels;
- `batches`: what a SandboxBatch's replicas run, how a task's end is judged, a batch's phase and counts;
- pool sizing, slow start and adoption order are `corral.operator.planning` (pure planners, older than this package).

Pure functions and small types only: no I/O, no Kubernetes or Docker client.
"""
