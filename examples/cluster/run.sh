#!/usr/bin/env bash
# A word count over two Sluice hosts on this machine, meeting through a local Kafka
# broker: starts the broker, writes 20,000 lines into a topic of 4 partitions, runs two
# `sluice run --cluster` processes until the job has finished, checks the counts against
# an independent count of the same lines, and stops the broker.
set -euo pipefail
cd "$(dirname "$0")/../.."
rustup target add wasm32-wasip2
cargo build --release --target wasm32-wasip2 -p tokenize -p count
cargo build --release -p sluice
sluice=target/release/sluice
broker=scripts/kafka/broker.sh
dir=examples/cluster/out
mkdir -p "$dir"

eval "$($broker start)"
trap '$broker stop' EXIT
run=$(date +%s)
input=cluster-demo-lines-$run
output=cluster-demo-counts-$run
$broker topic "$input" 4 >/dev/null
$broker topic "$output" 1 >/dev/null

# 20,000 lines of 8 words from a vocabulary of 40, the same every run.
awk 'BEGIN { srand(7); for (i = 0; i < 20000; i++) { line = "";
       for (j = 0; j < 8; j++) line = line " word" int(rand() * 40); print substr(line, 2) } }' \
  >"$dir/lines.txt"
$broker tool org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$SLUICE_KAFKA" \
  --topic "$input" <"$dir/lines.txt"

sed -e "s/@NAME@/cluster-demo-$run/" -e "s/@BROKER@/$SLUICE_KAFKA/" \
  -e "s/@INPUT@/$input/" -e "s/@OUTPUT@/$output/" \
  examples/cluster/job.toml.in >examples/cluster/job.toml
echo "two hosts run job cluster-demo-$run (logs in $dir/host-*.log) ..."
for n in 1 2; do
  $sluice run --quiet examples/cluster/job.toml --cluster 2>"$dir/host-$n.log" &
done
sleep 3
$sluice status examples/cluster/job.toml --cluster || true
wait

# The last running count of each word is its total.
$broker tool org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$SLUICE_KAFKA" \
  --topic "$output" --from-beginning --isolation-level read_committed \
  --formatter-property print.key=true --timeout-ms 5000 2>/dev/null |
  awk -F '\t' '$2 > n[$1] { n[$1] = $2 } END { for (w in n) print w "\t" n[w] }' |
  sort >"$dir/counts.tsv"
tr ' ' '\n' <"$dir/lines.txt" | sort | uniq -c | awk '{ print $2 "\t" $1 }' | sort >"$dir/expected.tsv"
echo "most frequent words (word, count):"
sort -t $'\t' -k2,2nr "$dir/counts.tsv" | head -5
if cmp -s "$dir/counts.tsv" "$dir/expected.tsv"; then
  echo "the committed counts equal an independent count of the input"
else
  echo "the committed counts differ from an independent count of the input" >&2
  exit 1
fi
