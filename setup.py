"""Package discovery for the `corral` distribution (metadata, dependencies, extras and package data: pyproject.toml).

The importable names are corral.<part>; the parts are the repository's fixed top-level folders (ARCHITECTURE.md),
so each folder maps to a package here and every folder below it is found, never listed by hand (a folder of data,
such as api/crds, is a package without code, as setuptools wants). `operator/` deliberately has no __init__.py:
with the repository root on sys.path a regular package there would shadow the standard library's `operator`
module; as a namespace portion it never does. `templates/` (the Jinja catalogue) and `charts/` (the operator's Helm
chart) hold no Python: they ship as package data at corral/templates and corral/charts, beside corral/components,
which finds them there as in the repository."""

from setuptools import find_namespace_packages, setup

CODE = ("api", "client", "components", "execd", "operator")
DATA = ("templates", "charts")

setup(
    package_dir={f"corral.{part}": part for part in CODE + DATA},
    packages=[f"corral.{part}" for part in CODE + DATA]
    + [f"corral.{part}.{sub}" for part in CODE + DATA
       for sub in find_namespace_packages(where=part, exclude=["__pycache__", "*.__pycache__"])],
)
