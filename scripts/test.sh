#!/usr/bin/env bash
# The whole test suite, self-sufficient: adds the wasm target, starts a real Kafka broker
# for the Kafka tests (scripts/kafka/broker.sh: Java and Maven fetch it once), runs every
# test, and stops the broker, however the tests end. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

rustup target add wasm32-wasip2

state=$(mktemp -d "${TMPDIR:-/tmp}/sluice-kafka.XXXXXX")
stop_broker() {
  scripts/kafka/broker.sh stop "$state" >&2 || true
  rm -rf -- "$state"
}
trap stop_broker EXIT
eval "$(scripts/kafka/broker.sh start "$state")"
# Tests that need the broker fail, rather than skip, when it is missing.
export SLUICE_KAFKA SLUICE_KAFKA_REQUIRED=1

cargo test --workspace --release "$@"

# The SDK stays ready to publish: its package (with sluice-codec's) builds on its own,
# and its documentation has no broken links or missing docs.
if [ "$#" -eq 0 ]; then
  cargo package --quiet -p sluice-codec -p sluice-sdk --allow-dirty
  RUSTDOCFLAGS="-D warnings" cargo doc --quiet --release -p sluice-sdk --no-deps
fi
