"""`python -m corral.execd`: run the daemon (configured by CORRAL_EXECD_* env, see settings.py)."""

import sys

from .server import main

sys.exit(main())
