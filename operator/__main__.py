"""`python -m corral.operator`: run the operator (kopf) with Corral's handlers.

Flags pass through to `kopf run` (e.g. `--standalone`, `--namespace ns`, `--liveness http://0.0.0.0:8080/healthz`).
"""

import os
import sys

import kopf.cli


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not any(a in ("-A", "--all-namespaces") or a.startswith(("-n", "--namespace")) for a in args):
        args.append("--all-namespaces")
    if not any(a.startswith("--liveness") for a in args):
        # kopf's health endpoint: 200 while the operator runs, with Corral's probe (cache ready, pending timers).
        args.append(f"--liveness=http://0.0.0.0:{os.environ.get('CORRAL_HEALTH_PORT', '8080')}/healthz")
    sys.argv = ["kopf", "run", "-m", "corral.operator.handlers", *args]
    kopf.cli.main()


if __name__ == "__main__":
    main()
