"""corral.operator.docker: the operator's Docker runtime.

The same kinds and semantics as on Kubernetes (templates, warm pools, pools with capacity and recycling, claims with a
lifecycle and a TTL), reconciled against one Docker Engine through the docker SDK:

- `spec`    the pools file (desired state written by the DockerStack component) and the Docker form of a template;
- `store`   claim and sandbox state in SQLite (WAL), because Docker labels cannot change after create;
- `engine`  every Docker call: hardened sandbox containers, execd volume, pause, commit, sweep;
- `pools`   the per-pool workers (plan with corral.operator.planning, act in slow-start batches);
- `runtime` the claims backend (warm adoption is one store transaction) + recovery from the engine and the store;
- `main`    the entry point: `python -m corral.operator.docker` (also the operator image's command).
"""
