#!/usr/bin/env bash
# Builds a JavaScript operator — an ES module that registers its class with
# exportOperator from 'sluice-sdk' — into a component: bundled with esbuild, then
# componentize-js (both pinned with their dependencies, installed on first use into
# target/tools), with the WASI features the host does not offer (http) disabled.
#
#   scripts/build-js-plugin.sh plugins-js/count.js target/js-plugins/count.wasm
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 MODULE.js OUT.wasm" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
module=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
out=$2
# The tools and all their dependencies are pinned by scripts/js-tools/package-lock.json
# (componentize-js 0.23.0, esbuild 0.25.12), installed with `npm ci` into a folder named
# after the lock, so a changed lock installs afresh.
lock=$root/scripts/js-tools/package-lock.json
tools=$root/target/tools/js-$(sha256sum "$lock" | cut -c1-16)
if [ ! -x "$tools/node_modules/.bin/componentize-js" ] || [ ! -x "$tools/node_modules/.bin/esbuild" ]; then
  rm -rf "$tools"
  mkdir -p "$tools"
  cp "$root/scripts/js-tools/package.json" "$lock" "$tools/"
  (cd "$tools" && npm ci --silent --no-audit --no-fund)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/node_modules"
ln -s "$root/sdk-js" "$work/node_modules/sluice-sdk"
# The module stays where it is, so that what it imports beside it (and its own
# node_modules) resolve; `sluice-sdk` resolves to this checkout's through NODE_PATH.
cat > "$work/app.js" <<APP
import '$module'; // registers its operator with exportOperator
export { streamOperator } from 'sluice-sdk/wasm';
APP
NODE_PATH="$work/node_modules" "$tools/node_modules/.bin/esbuild" "$work/app.js" --bundle \
  --format=esm --platform=neutral --external:'sluice:operator/*' --log-level=warning \
  --outfile="$work/bundle.js"
mkdir -p "$(dirname "$out")"
"$tools/node_modules/.bin/componentize-js" "$work/bundle.js" --wit "$root/wit/operator.wit" \
  --world-name operator --disable http fetch-event -o "$out"
