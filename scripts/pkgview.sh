#!/usr/bin/env bash
# A view of the repository as the installed `corral` package, for tools that import by package name (mypy,
# import-linter): DIR/corral/{api,client,components,execd} link to the top-level folders, and DIR/corral/operator is a
# real directory (the repo's operator/ is a namespace portion, setup.py) with an empty __init__.py and one link per
# entry of operator/. Creates DIR or refreshes it in place; prints nothing.
# Usage: scripts/pkgview.sh DIR      then e.g.  cd DIR && mypy --config-file "$REPO/pyproject.toml" -p corral
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=$1
pkg="$dir/corral"

rm -rf "$pkg"
mkdir -p "$pkg/operator"
: >"$pkg/__init__.py"
for part in api client components execd; do
  ln -s "$repo/$part" "$pkg/$part"
done
: >"$pkg/operator/__init__.py"
for entry in "$repo"/operator/*; do
  name=$(basename "$entry")
  [[ $name == __pycache__ ]] && continue
  ln -s "$entry" "$pkg/operator/$name"
done
