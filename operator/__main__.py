"""`python -m corral.operator`: run the operator (kopf) with Corral's handlers.

Flags pass through to `kopf run` (e.g. `--standalone`, `--peering NAME`, `--namespace ns`,
`--liveness http://0.0.0.0:8080/healthz`). Defaults: every namespace, kopf's health endpoint on $CORRAL_HEALTH_PORT
(8080), and with `--peering` but no `--priority` a random priority: kopf pauses *every* replica when two peers share
a priority, so identical replicas (a Deployment's) must differ; the highest one acts, the others stand by.
"""

import os
import secrets
import socket
import sys

import kopf.cli


def kopf_args(argv: list[str]) -> list[str]:
    """The `kopf run` arguments for Corral's command line `argv`."""
    args = list(argv)
    if not any(a in ("-A", "--all-namespaces") or a.startswith(("-n", "--namespace")) for a in args):
        args.append("--all-namespaces")
    if not any(a.startswith("--liveness") for a in args):
        # kopf's health endpoint: 200 while the operator runs, with Corral's probe (cache ready, pending timers).
        args.append(f"--liveness=http://0.0.0.0:{os.environ.get('CORRAL_HEALTH_PORT', '8080')}/healthz")
    if os.environ.get("CORRAL_SHARDS", "0") not in ("", "0") and \
            not any(a.startswith(("--peering", "--standalone")) for a in args):
        args.append("--standalone")  # sharded mode: every replica acts (corral.operator.shards), no kopf peering
    if any(a.startswith("--peering") for a in args) and not any(a.startswith("--priority") for a in args):
        args.append(f"--priority={1 + secrets.randbelow(2**31 - 1)}")
    return ["run", "-m", "corral.operator.handlers", *args]


def peer_identity(environ: dict[str, str]) -> str:
    """kopf's peer identity (its POD_ID), fixed here so Corral knows it too: corral.operator.leadership reads the
    same peering object. The pod's name under the chart; else host, pid and a random suffix."""
    return environ.get("POD_ID") or environ.get("CORRAL_POD_NAME") or \
        f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"


def main(argv: list[str] | None = None) -> None:
    sys.argv = ["kopf", *kopf_args(sys.argv[1:] if argv is None else argv)]
    os.environ["POD_ID"] = peer_identity(dict(os.environ))
    kopf.cli.main()


if __name__ == "__main__":
    main()
