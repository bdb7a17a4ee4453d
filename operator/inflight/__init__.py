"""The operator's in-flight state: what one process knows that the cluster does not show yet, one type per concern.

The reconcilers read the cluster from the watch-fed cache, which trails the API server by an event or two. In that
gap the operator remembers its own writes so that it neither repeats them nor acts on a stale picture. Each piece of
that memory is a small type here that says what it holds, why, and when each entry goes (none may outlive the object
it is about: a long-running operator sees millions of claims):

- `ClaimBook` (claims.py): adoptions and bindings not yet in the cache, the claim phase last written, when a claim
  was first seen;
- `PoolPacing` (pacing.py): claim streams per pool, and the refills and status writes that wait for them;
- `SandboxStarts` (starts.py): pod creates not yet seen, and intermediate sandbox statuses held back;
- `NamespaceRepairs` (namespaces.py): namespaces being deleted, and the lost-pod repair in flight in each;
- `TokenBook` (tokens.py): claim tokens put into execd, and the namespaces whose execd key Secret exists;
- `TemplateSpecs` (templates.py): validated template specs and their blueprint hashes, per spec generation;
- `PoolLocks` (locks.py): one lock per Pool around its capacity check and creates;
- `Expectations` (expectations.py): creates per pool not yet seen in the cache.

`corral.operator.context.Context` holds one of each. Everything here is process memory: a restarted operator starts
empty and rebuilds what it needs from the cluster (each type says how).
"""

from .claims import ClaimBook
from .expectations import Expectations
from .locks import PoolLocks
from .namespaces import NamespaceRepairs
from .pacing import PoolPacing
from .starts import SandboxStarts
from .templates import TemplateSpecs
from .tokens import TokenBook

__all__ = ["ClaimBook", "Expectations", "NamespaceRepairs", "PoolLocks", "PoolPacing", "SandboxStarts",
           "TemplateSpecs", "TokenBook"]
