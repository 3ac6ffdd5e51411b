#!/usr/bin/env bash
# Builds a Python operator — a module that registers its class with sluice_sdk.export —
# into a component, with the pinned componentize-py (installed on first use into
# target/tools).
#
#   scripts/build-python-plugin.sh plugins-python/count.py target/python-plugins/count.wasm
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 MODULE.py OUT.wasm" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
module=$1
out=$2
version=0.25.0
venv=$root/target/tools/componentize-py-$version
if [ ! -x "$venv/bin/componentize-py" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "componentize-py==$version"
fi
name=$(basename "$module" .py)
if ! python3 -c 'import keyword, sys; n = sys.argv[1]; sys.exit(not n.isidentifier() or keyword.iskeyword(n) or n in ("app", "sluice_sdk", "sluice_wit"))' "$name"; then
  echo "$module: name the module otherwise (a Python identifier, not a keyword, app, sluice_sdk or sluice_wit)" >&2
  exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$module" "$work/$name.py"
cat > "$work/app.py" <<APP
import $name  # registers its operator with sluice_sdk.export
from sluice_sdk._wasm import StreamOperator  # the export componentize-py looks for
APP
mkdir -p "$(dirname "$out")"
# The module's own folder too, for the modules beside it that it imports.
"$venv/bin/componentize-py" -d "$root/wit/operator.wit" -w operator \
  --world-module sluice_wit componentize app -p "$work" -p "$(dirname "$module")" \
  -p "$root/sdk-python" -o "$out"
