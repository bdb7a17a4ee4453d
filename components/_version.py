"""The version of Corral's public API (the `corral` distribution's, semantic versioning; see CHANGELOG.md)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("corral")
except PackageNotFoundError:  # a checkout on sys.path without `pip install -e .`
    __version__ = "0.0.0"
