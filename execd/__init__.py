"""corral.execd: the in-sandbox daemon (commands, files, directories, PTY, proxy) behind one token.

Kept import-free on purpose: `python -m corral.execd` is on the sandbox cold-start path, so nothing heavy is imported
until `create_app` runs.
"""

__version__ = "0.1.0"
