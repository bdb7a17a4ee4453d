"""Wire facts about execd that other parts of Corral must agree on (the operator's readiness probe and token
handover, the Docker runtime's health check, the claims API's proxy, the components' NetworkPolicies): one home, so a
probe can never ask for a path execd does not serve (the kubelet's probe once asked for /health, which execd refuses
with 401; kwok never probes, so nothing saw it).

Import-free, so execd's supervisor and anything else may import it without loading execd (or pydantic). The
resource model (`corral.api`, which imports no other Corral package) keeps its own copy of the port and the env
prefix; tests/unit/test_wire_facts.py holds the two equal and keeps these literals out of the rest of the code.
"""

PORT = 44772                   # execd's default listen port (a SandboxTemplate's execd.port overrides it)
HEALTH_PATH = "/v1/health"     # the one endpoint without a token: liveness and readiness
TOKEN_PATH = "/v1/token"       # PUT {"token"}: replace the token (the operator, at each bind and release)
ENV_PATH = "/v1/env"           # PUT {"env", "merge"}: the env injected into every later command and PTY
TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"  # OpenSandbox execd's header; `Authorization: Bearer <token>` works too
ENV_PREFIX = "CORRAL_EXECD_"   # execd's settings, read from its environment (and never passed on to commands)
