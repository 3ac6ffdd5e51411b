#!/usr/bin/env bash
# Runs the word-count demo end to end: builds the plugins it needs as components, builds
# the host, runs examples/wordcount/job.toml and shows where the output went.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-deps.sh
cargo build --release --target wasm32-wasip2 -p tokenize -p filter -p count -p window
# A demo starts over each time: --fresh moves an earlier run's output and checkpoints
# aside (out/counts.tsv.1, ...) instead of refusing to start. Arguments replace it.
if [ $# -eq 0 ]; then set -- --fresh; fi
cargo run --release -p sluice -- run examples/wordcount/job.toml "$@"
echo
echo "most frequent words (word, count):"
# (awk reads to the end: a reader that stopped early would end `sort` with SIGPIPE,
# and the script with it under pipefail.)
sort -t $'\t' -k2,2nr examples/wordcount/out/counts.tsv |
  awk -F '\t' '!seen[$1]++ && shown < 5 { print; shown++ }'
