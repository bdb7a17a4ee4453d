"""corral.operator.docker: the operator's Docker runtime.

The same kinds and semantics as on Kubernetes (templates, warm pools, pools with capacity and recycling, claims with a
lifecycle and a TTL, batches), reconciled against one Docker Engine through the docker SDK:

- `desired`   the pools file (desired state written by the DockerStack component) and the Docker form of a template;
- `store`     claim, sandbox and batch state in SQLite (WAL), because Docker labels cannot change after create;
- `engine`    every Docker call: hardened sandbox containers, execd volume, pause, commit, sweep;
- `runtime`   the claims backend, composed of the parts below, each given its dependencies explicitly:
  `runner` (thread pool, background tasks), `sandboxes` (start, recycle, delete; execd calls), `pools` (per-pool
  workers planning with corral.operator.planning, in slow-start batches), `claims` (warm adoption is one store
  transaction), `batches` (N sandboxes of a pool and a task in each, followed over execd's wait streams),
  `recovery` (engine events, resync), `retained` (retained sandboxes, snapshots);
- `main`      the entry point: `python -m corral.operator.docker` (also the operator image's command).
"""
