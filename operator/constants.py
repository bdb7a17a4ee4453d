"""Names the operator owns: API group, labels, annotations, field manager."""

from corral.api.common import API_VERSION, GROUP, VERSION

__all__ = ["API_VERSION", "GROUP", "VERSION"]

FIELD_MANAGER = "corral-operator"
FINALIZER = f"{GROUP}/finalizer"

# Labels on Sandboxes and their pods.
L_TEMPLATE = f"{GROUP}/template"          # the SandboxTemplate a sandbox was made from
L_POOL = f"{GROUP}/pool"                  # the WarmPool/Pool a sandbox belongs (or belonged) to
L_POOL_KIND = f"{GROUP}/pool-kind"        # WarmPool | Pool
L_CLAIM = f"{GROUP}/claim"                # the claim a sandbox is bound to (absent: idle)
L_SANDBOX = f"{GROUP}/sandbox"            # on pods: the owning Sandbox
L_HASH = f"{GROUP}/blueprint-hash"        # blueprint hash at creation
L_CLAIMS_API = f"{GROUP}/claims-api"      # on the operator's own pod: "active" while it serves the claims API
L_RETAINED = f"{GROUP}/retained"          # "true" on a Sandbox kept after its claim ended (shutdownPolicy Retain)
L_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "corral-operator"
L_COMPONENT = "app.kubernetes.io/component"

# Annotations.
A_LAUNCH = f"{GROUP}/launch-type"         # Warm | Cold, set on adoption / cold create
A_RELEASED = f"{GROUP}/released"          # set when a pool sandbox returns from a claim
A_CLAIM_UID = f"{GROUP}/claim-uid"        # the uid of the claim a sandbox is bound to (its execd token derives from it)
A_RETAINED_FROM = f"{GROUP}/retained-from"  # on a retained Sandbox: the claim it was retained from,
A_RETAINED_POOL = f"{GROUP}/retained-pool"  # that claim's pool (the pool labels are removed),
A_RETAINED_AT = f"{GROUP}/retained-at"      # and when (RFC 3339)

OPERATOR_APP_LABEL = {"app.kubernetes.io/name": "corral-operator"}
