"""Wire facts about execd that other parts of Corral must agree on (the operator's readiness probe, the Docker
runtime's health check, the claims API's proxy): one home, so a probe can never ask for a path execd does not serve
(the kubelet's probe once asked for /health, which execd refuses with 401; kwok never probes, so nothing saw it)."""

HEALTH_PATH = "/v1/health"     # the one endpoint without a token: liveness and readiness
