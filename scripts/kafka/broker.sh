#!/usr/bin/env bash
# Fetch, start and stop a real Apache Kafka broker (KRaft, one combined
# broker+controller node) on 127.0.0.1, for Sluice's integration tests and for
# trying things by hand. See scripts/kafka/README.md.
#
#   broker.sh fetch                 copy the pinned jars into the cache (once)
#   broker.sh start [DIR]           start in the background; prints export SLUICE_KAFKA=127.0.0.1:PORT,
#                                   SLUICE_KAFKA_DIR=DIR, and the SASL_SSL and SSL (mTLS)
#                                   listeners, TLS files and SASL user (for eval)
#   broker.sh stop [DIR]            stop the broker of DIR (default $SLUICE_KAFKA_DIR)
#   broker.sh topic NAME PARTITIONS create a topic on $SLUICE_KAFKA
#   broker.sh run [DIR]             run in the foreground until Ctrl-C
#   broker.sh tool MAIN [ARGS...]   run a Java main class from the pinned jars
#                                   (e.g. org.apache.kafka.tools.ConsoleProducer)
set -euo pipefail

# Keep in sync with <kafka.version> in pom.xml (checked by fetch).
readonly KAFKA_VERSION=4.4.0

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR
readonly POM=$SCRIPT_DIR/pom.xml
readonly CACHE=${SLUICE_KAFKA_HOME:-$HOME/.cache/sluice/kafka-$KAFKA_VERSION}
readonly LIB=$CACHE/lib
readonly READY_TIMEOUT=${SLUICE_KAFKA_READY_TIMEOUT:-60}
readonly STOP_TIMEOUT=${SLUICE_KAFKA_STOP_TIMEOUT:-30}
# Marker file: the state dir was made by `start`/`run` with mktemp, so `stop` removes it.
readonly TEMP_MARKER=.sluice-kafka-temp

log() { printf 'broker.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

usage() {
  sed -n '5,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# ---------------------------------------------------------------- fetch

pom_sum() { sha256sum "$POM" | cut -d' ' -f1; }

fetched() {
  [[ -d $LIB && -f $CACHE/.complete ]] && [[ $(<"$CACHE/.complete") == "$(pom_sum)" ]]
}

cmd_fetch() {
  fetched && return 0
  grep -q "<kafka.version>$KAFKA_VERSION</kafka.version>" "$POM" ||
    die "KAFKA_VERSION=$KAFKA_VERSION in broker.sh does not match kafka.version in $POM"
  command -v mvn >/dev/null || die "mvn not found: Maven 3.8+ is needed to fetch the Kafka jars"
  mkdir -p "$CACHE"
  # Serialise concurrent fetches (parallel test runs); released when the fd closes.
  exec 9>"$CACHE/.lock"
  if command -v flock >/dev/null; then flock 9; fi
  if fetched; then exec 9>&-; return 0; fi
  local tmp=$CACHE/lib.tmp.$$
  rm -rf -- "$tmp"
  log "fetching Kafka $KAFKA_VERSION jars into $LIB"
  # (sed drops the stray colour codes Maven 3.8 prints even with -B -q.)
  if ! mvn -q -B -Dstyle.color=never -f "$POM" dependency:copy-dependencies \
    -DoutputDirectory="$tmp" 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >&2; then
    rm -rf -- "$tmp"
    exec 9>&-
    die "fetch failed (mvn dependency:copy-dependencies, see above)"
  fi
  rm -rf -- "$LIB"
  mv -- "$tmp" "$LIB"
  pom_sum >"$CACHE/.complete"
  exec 9>&-
}

# ---------------------------------------------------------------- helpers

java_tool() {
  # Short-lived command-line JVM: small heap, quick start, Kafka's tools log config.
  java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j2.configurationFile="$SCRIPT_DIR/tools-log4j2.properties" \
    -Dlog4j2.shutdownHookEnabled=false \
    -cp "$LIB/*" "$@"
}

# Four distinct free TCP ports on 127.0.0.1: "BROKER CONTROLLER SASL_SSL SSL".
free_ports() {
  python3 -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks:
    s.close()
'
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Value of KEY in a KEY=VALUE file (env file or server.properties).
file_get() { sed -n "s/^$2=//p" "$1" | tail -n 1; }

# The port of listener NAME in a listeners list ("PLAINTEXT://127.0.0.1:9092,...").
listener_port() { tr ',' '\n' <<<"$1" | sed -n "s|^$2://.*:||p"; }

# True if PID is alive and is the broker of state dir DIR.
is_broker() {
  local pid=$1 dir=$2 args
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  args=$(ps -ww -o args= -p "$pid" 2>/dev/null) || return 1
  [[ $args == *kafka.Kafka*"$dir/server.properties"* ]]
}

# SIGTERM, wait up to STOP_TIMEOUT s, then SIGKILL.
stop_pid() {
  local pid=$1 dir=$2 i
  is_broker "$pid" "$dir" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < STOP_TIMEOUT * 5; i++)); do
    is_broker "$pid" "$dir" || return 0
    sleep 0.2
  done
  log "broker $pid did not stop within ${STOP_TIMEOUT}s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    is_broker "$pid" "$dir" || return 0
    sleep 0.1
  done
  die "broker $pid is still running after SIGKILL"
}

show_log_tail() {
  local dir=$1 f
  for f in "$dir/broker.log" "$dir/broker.out"; do
    if [[ -s $f ]]; then
      log "---- tail of $f"
      tail -n 40 -- "$f" >&2
    fi
  done
}

# ---------------------------------------------------------------- TLS and SASL

# The test user of the SASL_SSL listener (PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512).
readonly SASL_USER=alice
readonly SASL_PASSWORD=alice-secret
readonly KEYSTORE_PASSWORD=sluice-broker

# make_tls DIR: a throwaway CA, the broker's certificate (for 127.0.0.1 and localhost)
# signed by it in a PKCS#12 keystore, a client certificate signed by it (mTLS), and a
# second CA that signed neither (an untrusted one, for tests).
make_tls() {
  local dir=$1
  mkdir -p -- "$dir"
  (
    cd "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj /CN=sluice-test-ca \
      -keyout ca.key -out ca.pem 2>/dev/null
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj /CN=sluice-other-ca \
      -keyout other-ca.key -out other-ca.pem 2>/dev/null
    local name
    for name in broker client; do
      openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=sluice-test-$name" \
        -keyout "$name.key" -out "$name.csr" 2>/dev/null
      printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$name.ext"
      openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
        -sha256 -extfile "$name.ext" -out "$name.pem" 2>/dev/null
      rm -f -- "$name.csr" "$name.ext"
    done
    openssl pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem \
      -passout "pass:$KEYSTORE_PASSWORD" -out broker.p12 2>/dev/null
  ) || die "making the test TLS certificates in $dir failed (openssl)"
}

# ---------------------------------------------------------------- start / run

# Globals set by prepare/launch, used by start, run, stop and their cleanup.
STATE=       # state dir (absolute)
STATE_TEMP=0 # STATE is a mktemp dir: remove it when the broker stops
MADE_TEMP=0  # ... and this invocation made it
PORT=
SASL_PORT=   # the SASL_SSL listener's
SSL_PORT=    # the SSL (mTLS) listener's
PID=         # broker pid, once this invocation launched it (or stop read it)
LOG_OFFSET=0

# prepare [DIR]: choose the state dir, write server.properties, format storage.
# A DIR holding a formatted broker from an earlier start is restarted with its
# data and ports.
prepare() {
  local dir=${1:-}
  cmd_fetch
  if [[ -z $dir ]]; then
    STATE=$(mktemp -d "${TMPDIR:-/tmp}/sluice-kafka.XXXXXX")
    STATE_TEMP=1
    MADE_TEMP=1
    : >"$STATE/$TEMP_MARKER"
  else
    mkdir -p -- "$dir"
    dir=$(cd "$dir" && pwd)
    if [[ -f $dir/env ]] && is_broker "$(file_get "$dir/env" SLUICE_KAFKA_PID)" "$dir"; then
      die "a broker is already running in $dir ($(file_get "$dir/env" SLUICE_KAFKA))"
    fi
    STATE=$dir
    [[ -f $STATE/$TEMP_MARKER ]] && STATE_TEMP=1
    rm -f -- "$STATE/env"
  fi

  if [[ -f $STATE/server.properties && -f $STATE/data/meta.properties ]]; then
    local advertised
    advertised=$(file_get "$STATE/server.properties" advertised.listeners)
    PORT=$(listener_port "$advertised" PLAINTEXT)
    SASL_PORT=$(listener_port "$advertised" SASL_SSL)
    SSL_PORT=$(listener_port "$advertised" SSL)
    log "restarting the broker in $STATE (port $PORT)"
    return 0
  fi
  [[ ! -e $STATE/data ]] || die "$STATE/data exists but holds no formatted broker; remove it or use another DIR"

  local ports ctrl
  read -r PORT ctrl SASL_PORT SSL_PORT <<<"$(free_ports)"
  make_tls "$STATE/tls"
  cat >"$STATE/server.properties" <<EOF
# Written by scripts/kafka/broker.sh (Kafka $KAFKA_VERSION, KRaft, one combined node).
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$ctrl
# Plaintext for most tests; SASL_SSL (PLAIN, SCRAM) and SSL with client certificates
# (mTLS) as managed clusters are reached.
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$ctrl,SASL_SSL://127.0.0.1:$SASL_PORT,SSL://127.0.0.1:$SSL_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT,SASL_SSL://127.0.0.1:$SASL_PORT,SSL://127.0.0.1:$SSL_PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL
inter.broker.listener.name=PLAINTEXT
ssl.keystore.type=PKCS12
ssl.keystore.location=$STATE/tls/broker.p12
ssl.keystore.password=$KEYSTORE_PASSWORD
ssl.key.password=$KEYSTORE_PASSWORD
ssl.truststore.type=PEM
ssl.truststore.location=$STATE/tls/ca.pem
listener.name.ssl.ssl.client.auth=required
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$SASL_USER="$SASL_PASSWORD";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
log.dirs=$STATE/data
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# The test machine is shared (2 cores, tests spinning busy operators beside the broker):
# a broker whose heartbeat waits past 9 s (the default) for the CPU is fenced, and every
# test then fails with timeouts or InvalidReplicationFactor. A minute rides that out.
broker.session.timeout.ms=60000
EOF
  if [[ -n ${SLUICE_KAFKA_PROPS:-} ]]; then
    printf '# From SLUICE_KAFKA_PROPS:\n%s\n' "$SLUICE_KAFKA_PROPS" >>"$STATE/server.properties"
  fi

  local cluster_id
  cluster_id=$(java_tool kafka.tools.StorageTool random-uuid)
  if ! java_tool kafka.tools.StorageTool format --standalone -t "$cluster_id" \
    -c "$STATE/server.properties" \
    --add-scram "SCRAM-SHA-256=[name=$SASL_USER,password=$SASL_PASSWORD]" \
    --add-scram "SCRAM-SHA-512=[name=$SASL_USER,password=$SASL_PASSWORD]" \
    >"$STATE/format.out" 2>&1; then
    cat -- "$STATE/format.out" >&2
    die "formatting storage in $STATE/data failed"
  fi
}

launch() {
  local jvm_extra=()
  read -r -a jvm_extra <<<"${SLUICE_KAFKA_JVM_OPTS:-}"
  LOG_OFFSET=0
  [[ -f $STATE/broker.log ]] && LOG_OFFSET=$(wc -c <"$STATE/broker.log")
  local detach=()
  # Own session: no SIGINT/SIGHUP from the terminal that ran `start`.
  command -v setsid >/dev/null && detach=(setsid)
  # stdout/stderr go to a file so that $(broker.sh start) does not wait for the JVM.
  "${detach[@]}" java -Xms256m -Xmx1g -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    "${jvm_extra[@]}" \
    -Dlog4j2.configurationFile="$SCRIPT_DIR/log4j2.properties" \
    -Dlog4j2.shutdownHookEnabled=false \
    -Dkafka.logs.dir="$STATE" \
    -cp "$LIB/*" kafka.Kafka "$STATE/server.properties" \
    </dev/null >>"$STATE/broker.out" 2>&1 &
  PID=$!
  {
    echo "SLUICE_KAFKA=127.0.0.1:$PORT"
    echo "SLUICE_KAFKA_PID=$PID"
    printf 'SLUICE_KAFKA_DIR=%q\n' "$STATE"
  } >"$STATE/env.tmp"
  mv -- "$STATE/env.tmp" "$STATE/env"
}

# What the tests need to reach the secure listeners: their addresses, the TLS files
# (CA, client certificate and key, another CA) and the SASL user (for eval).
secure_exports() {
  echo "export SLUICE_KAFKA_SASL_SSL=127.0.0.1:$SASL_PORT"
  echo "export SLUICE_KAFKA_SSL=127.0.0.1:$SSL_PORT"
  printf 'export SLUICE_KAFKA_TLS=%q\n' "$STATE/tls"
  echo "export SLUICE_KAFKA_USER=$SASL_USER SLUICE_KAFKA_PASSWORD=$SASL_PASSWORD"
}

# Poll until the broker logs that it started (it does so once it is unfenced
# and serving requests) and its port accepts connections.
wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! is_broker "$PID" "$STATE"; then
      log "broker exited during start-up"
      return 1
    fi
    if tail -c "+$((LOG_OFFSET + 1))" -- "$STATE/broker.log" 2>/dev/null |
      grep -q 'Kafka Server started' && port_open "$PORT"; then
      return 0
    fi
    sleep 0.2
  done
  log "broker not ready within ${READY_TIMEOUT}s"
  return 1
}

# Stop the broker (if any) and drop the env file, and the state dir if temporary.
teardown() {
  [[ -n $STATE ]] || return 0
  if [[ -n $PID ]]; then stop_pid "$PID" "$STATE"; fi
  rm -f -- "$STATE/env"
  if ((STATE_TEMP)); then rm -rf -- "$STATE"; fi
}

# EXIT trap of start/run: on failure undo what this invocation did.
on_start_exit() {
  local rc=$?
  ((rc != 0)) || return 0
  if [[ -n $PID ]]; then
    show_log_tail "$STATE"
    stop_pid "$PID" "$STATE"
    rm -f -- "$STATE/env"
  fi
  if ((MADE_TEMP)); then rm -rf -- "$STATE"; fi
}

cmd_start() {
  (($# <= 1)) || usage
  trap on_start_exit EXIT
  trap 'exit 130' INT TERM
  prepare "${1:-}"
  launch
  wait_ready || exit 1
  trap - EXIT INT TERM
  # Exported, so that `broker.sh topic` and `broker.sh stop` (and the tests) find it.
  echo "export SLUICE_KAFKA=127.0.0.1:$PORT"
  printf 'export SLUICE_KAFKA_DIR=%q\n' "$STATE"
  secure_exports
}

cmd_run() {
  (($# <= 1)) || usage
  local stopping=0 rc=0
  trap on_start_exit EXIT
  trap 'exit 130' INT TERM
  prepare "${1:-}"
  echo "SLUICE_KAFKA=127.0.0.1:$PORT"
  launch
  log "state dir $STATE, log $STATE/broker.log; Ctrl-C stops the broker"
  wait_ready || exit 1
  log "ready: export SLUICE_KAFKA=127.0.0.1:$PORT"
  trap 'stopping=1' INT TERM
  while ((!stopping)) && is_broker "$PID" "$STATE"; do
    # Returns early on a trapped signal; sleep in case PID is not our child.
    wait "$PID" 2>/dev/null || sleep 0.2
  done
  if ((!stopping)); then
    log "broker exited by itself"
    show_log_tail "$STATE"
    rc=1
  fi
  log "stopping"
  teardown
  trap - EXIT
  exit "$rc"
}

# ---------------------------------------------------------------- stop / topic / tool

cmd_stop() {
  (($# <= 1)) || usage
  local dir=${1:-${SLUICE_KAFKA_DIR:-}}
  [[ -n $dir ]] || die "stop: give DIR or set SLUICE_KAFKA_DIR"
  [[ -d $dir ]] || die "stop: no such directory: $dir"
  STATE=$(cd "$dir" && pwd)
  if [[ ! -f $STATE/env ]]; then
    log "stop: no broker recorded in $STATE (no env file); nothing to stop"
    return 0
  fi
  PID=$(file_get "$STATE/env" SLUICE_KAFKA_PID)
  [[ -f $STATE/$TEMP_MARKER ]] && STATE_TEMP=1
  teardown
}

bootstrap() {
  if [[ -n ${SLUICE_KAFKA:-} ]]; then
    echo "$SLUICE_KAFKA"
  elif [[ -n ${SLUICE_KAFKA_DIR:-} && -f $SLUICE_KAFKA_DIR/env ]]; then
    file_get "$SLUICE_KAFKA_DIR/env" SLUICE_KAFKA
  else
    die "set SLUICE_KAFKA (host:port) or SLUICE_KAFKA_DIR, e.g. eval \"\$(broker.sh start)\""
  fi
}

cmd_topic() {
  (($# == 2)) || usage
  [[ $2 =~ ^[1-9][0-9]*$ ]] || die "topic: PARTITIONS must be a positive integer"
  local bs
  bs=$(bootstrap)
  cmd_fetch
  java_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bs" \
    --create --topic "$1" --partitions "$2" --replication-factor 1
}

cmd_tool() {
  (($# >= 1)) || usage
  cmd_fetch
  java_tool "$@"
}

main() {
  (($# >= 1)) || usage
  local cmd=$1
  shift
  case $cmd in
  fetch) (($# == 0)) || usage; cmd_fetch; echo "$LIB" ;;
  start) cmd_start "$@" ;;
  stop) cmd_stop "$@" ;;
  topic) cmd_topic "$@" ;;
  run) cmd_run "$@" ;;
  tool) cmd_tool "$@" ;;
  -h | --help | help) usage ;;
  *) usage ;;
  esac
}

main "$@"
