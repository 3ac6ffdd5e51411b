#!/usr/bin/env bash
# Build, start and stop a real schema registry on 127.0.0.1 that serves Confluent's
# Schema Registry REST API: Apicurio Registry (in-memory H2 storage) and its ccompat
# API at /apis/ccompat/v7. For Sluice's integration tests and for trying things by hand.
#
#   registry.sh build          build the registry into the cache (once; Maven Central only)
#   registry.sh start [DIR]    start in the background; prints export SLUICE_SCHEMA_REGISTRY=URL
#                              (the ccompat base URL), SLUICE_SCHEMA_REGISTRY_DIR=DIR and
#                              SLUICE_SCHEMA_REGISTRY_PID_FILE (for eval)
#   registry.sh stop [DIR]     stop the registry of DIR (default $SLUICE_SCHEMA_REGISTRY_DIR)
#   registry.sh run [DIR]      run in the foreground until Ctrl-C
#
# Schemas live in memory only: a restarted registry starts empty. Like Confluent's, the
# global compatibility level starts as BACKWARD (SLUICE_SCHEMA_REGISTRY_COMPATIBILITY
# changes it, e.g. NONE or FULL).
set -euo pipefail

# Keep in sync with <apicurio.version> in pom.xml (checked by build).
readonly APICURIO_VERSION=2.4.2.Final

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR
readonly POM=$SCRIPT_DIR/pom.xml
readonly SETTINGS=$SCRIPT_DIR/settings.xml
readonly CACHE=${SLUICE_SCHEMA_REGISTRY_HOME:-${SLUICE_CACHE_DIR:-$HOME/.cache/sluice}/apicurio-$APICURIO_VERSION}
readonly APP=$CACHE/quarkus-app
readonly READY_TIMEOUT=${SLUICE_SCHEMA_REGISTRY_READY_TIMEOUT:-60}
readonly STOP_TIMEOUT=${SLUICE_SCHEMA_REGISTRY_STOP_TIMEOUT:-30}
readonly COMPATIBILITY=${SLUICE_SCHEMA_REGISTRY_COMPATIBILITY:-BACKWARD}
readonly API_PATH=/apis/ccompat/v7
# Marker file: the state dir was made by `start`/`run` with mktemp, so `stop` removes it.
readonly TEMP_MARKER=.sluice-registry-temp

log() { printf 'registry.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

usage() {
  sed -n '6,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# ---------------------------------------------------------------- build

build_sum() { cat -- "$POM" "$SETTINGS" | sha256sum | cut -d' ' -f1; }

built() {
  [[ -f $APP/quarkus-run.jar && -f $CACHE/.complete ]] &&
    [[ $(<"$CACHE/.complete") == "$(build_sum)" ]]
}

cmd_build() {
  built && return 0
  grep -q "<apicurio.version>$APICURIO_VERSION</apicurio.version>" "$POM" ||
    die "APICURIO_VERSION=$APICURIO_VERSION in registry.sh does not match apicurio.version in $POM"
  command -v mvn >/dev/null || die "mvn not found: Maven 3.8+ is needed to build the registry"
  mkdir -p "$CACHE"
  # Serialise concurrent builds (parallel test runs); released when the fd closes.
  exec 9>"$CACHE/.lock"
  if command -v flock >/dev/null; then flock 9; fi
  if built; then exec 9>&-; return 0; fi
  local tmp=$CACHE/build.tmp.$$
  rm -rf -- "$tmp"
  log "building Apicurio Registry $APICURIO_VERSION into $APP (Quarkus build; about 30 s the first time)"
  # Quarkus' build over the published app jar; fast-jar gives quarkus-app/quarkus-run.jar.
  # (sed drops the stray colour codes Maven 3.8 prints even with -B -q.)
  if ! mvn -q -B -Dstyle.color=never -f "$POM" -s "$SETTINGS" \
    -Dregistry.build.dir="$tmp" '-D%prod.quarkus.package.type=fast-jar' package 2>&1 |
    sed 's/\x1b\[[0-9;]*m//g' >&2 || [[ ! -f $tmp/quarkus-app/quarkus-run.jar ]]; then
    rm -rf -- "$tmp"
    exec 9>&-
    die "build failed (mvn package with the Quarkus plugin, see above)"
  fi
  rm -rf -- "$APP"
  mv -- "$tmp/quarkus-app" "$APP"
  rm -rf -- "$tmp"
  build_sum >"$CACHE/.complete"
  exec 9>&-
}

# ---------------------------------------------------------------- helpers

free_port() {
  python3 -c '
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
'
}

# HTTP status code of GET PATH on 127.0.0.1:PORT (empty if no answer); no curl needed.
http_status() {
  local port=$1 path=$2
  (
    exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 0
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\n\r\n' "$path" "$port" >&3
    local _proto code _rest
    read -r -t 5 _proto code _rest <&3 || exit 0
    printf '%s\n' "$code"
  ) 2>/dev/null
}

# Value of KEY in a KEY=VALUE file.
file_get() { sed -n "s/^$2=//p" "$1" | tail -n 1; }

# True if PID is alive and is the registry of state dir DIR.
is_registry() {
  local pid=$1 dir=$2 args
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  args=$(ps -ww -o args= -p "$pid" 2>/dev/null) || return 1
  [[ $args == *"-Dsluice.registry.dir=$dir "*quarkus-run.jar* ]]
}

# SIGTERM, wait up to STOP_TIMEOUT s, then SIGKILL.
stop_pid() {
  local pid=$1 dir=$2 i
  is_registry "$pid" "$dir" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < STOP_TIMEOUT * 5; i++)); do
    is_registry "$pid" "$dir" || return 0
    sleep 0.2
  done
  log "registry $pid did not stop within ${STOP_TIMEOUT}s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    is_registry "$pid" "$dir" || return 0
    sleep 0.1
  done
  die "registry $pid is still running after SIGKILL"
}

show_log_tail() {
  if [[ -s $1/registry.log ]]; then
    log "---- tail of $1/registry.log"
    tail -n 40 -- "$1/registry.log" >&2
  fi
}

# ---------------------------------------------------------------- start / run

STATE=       # state dir (absolute)
STATE_TEMP=0 # STATE is a mktemp dir: remove it when the registry stops
MADE_TEMP=0  # ... and this invocation made it
PORT=
PID=         # registry pid, once this invocation launched it (or stop read it)

prepare() {
  local dir=${1:-}
  cmd_build
  if [[ -z $dir ]]; then
    STATE=$(mktemp -d "${TMPDIR:-/tmp}/sluice-registry.XXXXXX")
    STATE_TEMP=1
    MADE_TEMP=1
    : >"$STATE/$TEMP_MARKER"
  else
    mkdir -p -- "$dir"
    dir=$(cd "$dir" && pwd)
    if [[ -f $dir/env ]] && is_registry "$(file_get "$dir/env" SLUICE_SCHEMA_REGISTRY_PID)" "$dir"; then
      die "a registry is already running in $dir ($(file_get "$dir/env" SLUICE_SCHEMA_REGISTRY))"
    fi
    STATE=$dir
    [[ -f $STATE/$TEMP_MARKER ]] && STATE_TEMP=1
    rm -f -- "$STATE/env" "$STATE/registry.pid"
  fi
  PORT=$(free_port)
}

url() { echo "http://127.0.0.1:$PORT$API_PATH"; }

launch() {
  local jvm_extra=()
  read -r -a jvm_extra <<<"${SLUICE_SCHEMA_REGISTRY_JVM_OPTS:-}"
  local detach=()
  # Own session: no SIGINT/SIGHUP from the terminal that ran `start`.
  command -v setsid >/dev/null && detach=(setsid)
  # stdout/stderr go to a file so that $(registry.sh start) does not wait for the JVM.
  # -Dsluice.registry.dir marks the process as this DIR's (see is_registry).
  "${detach[@]}" java -Xms64m -Xmx512m -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    "${jvm_extra[@]}" \
    -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$PORT" \
    -Dregistry.rules.global.compatibility="$COMPATIBILITY" \
    -Dsluice.registry.dir="$STATE" \
    -jar "$APP/quarkus-run.jar" \
    </dev/null >>"$STATE/registry.log" 2>&1 &
  PID=$!
  echo "$PID" >"$STATE/registry.pid"
  {
    echo "SLUICE_SCHEMA_REGISTRY=$(url)"
    echo "SLUICE_SCHEMA_REGISTRY_PID=$PID"
    printf 'SLUICE_SCHEMA_REGISTRY_DIR=%q\n' "$STATE"
  } >"$STATE/env.tmp"
  mv -- "$STATE/env.tmp" "$STATE/env"
}

# Poll until GET /apis/ccompat/v7/subjects answers 200 (storage is up, REST is served).
wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! is_registry "$PID" "$STATE"; then
      log "registry exited during start-up"
      return 1
    fi
    [[ $(http_status "$PORT" "$API_PATH/subjects") == 200 ]] && return 0
    sleep 0.2
  done
  log "registry not ready within ${READY_TIMEOUT}s"
  return 1
}

teardown() {
  [[ -n $STATE ]] || return 0
  if [[ -n $PID ]]; then stop_pid "$PID" "$STATE"; fi
  rm -f -- "$STATE/env" "$STATE/registry.pid"
  if ((STATE_TEMP)); then rm -rf -- "$STATE"; fi
}

# EXIT trap of start/run: on failure undo what this invocation did.
on_start_exit() {
  local rc=$?
  ((rc != 0)) || return 0
  if [[ -n $PID ]]; then
    show_log_tail "$STATE"
    stop_pid "$PID" "$STATE"
    rm -f -- "$STATE/env" "$STATE/registry.pid"
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
  echo "export SLUICE_SCHEMA_REGISTRY=$(url)"
  printf 'export SLUICE_SCHEMA_REGISTRY_DIR=%q\n' "$STATE"
  printf 'export SLUICE_SCHEMA_REGISTRY_PID_FILE=%q\n' "$STATE/registry.pid"
}

cmd_run() {
  (($# <= 1)) || usage
  local stopping=0 rc=0
  trap on_start_exit EXIT
  trap 'exit 130' INT TERM
  prepare "${1:-}"
  launch
  log "state dir $STATE, log $STATE/registry.log; Ctrl-C stops the registry"
  wait_ready || exit 1
  log "ready: export SLUICE_SCHEMA_REGISTRY=$(url)"
  trap 'stopping=1' INT TERM
  while ((!stopping)) && is_registry "$PID" "$STATE"; do
    wait "$PID" 2>/dev/null || sleep 0.2
  done
  if ((!stopping)); then
    log "registry exited by itself"
    show_log_tail "$STATE"
    rc=1
  fi
  log "stopping"
  teardown
  trap - EXIT
  exit "$rc"
}

# ---------------------------------------------------------------- stop

cmd_stop() {
  (($# <= 1)) || usage
  local dir=${1:-${SLUICE_SCHEMA_REGISTRY_DIR:-}}
  [[ -n $dir ]] || die "stop: give DIR or set SLUICE_SCHEMA_REGISTRY_DIR"
  [[ -d $dir ]] || die "stop: no such directory: $dir"
  STATE=$(cd "$dir" && pwd)
  if [[ ! -f $STATE/env ]]; then
    log "stop: no registry recorded in $STATE (no env file); nothing to stop"
    return 0
  fi
  PID=$(file_get "$STATE/env" SLUICE_SCHEMA_REGISTRY_PID)
  [[ -f $STATE/$TEMP_MARKER ]] && STATE_TEMP=1
  teardown
}

main() {
  (($# >= 1)) || usage
  local cmd=$1
  shift
  case $cmd in
  build | fetch) (($# == 0)) || usage; cmd_build; echo "$APP" ;;
  start) cmd_start "$@" ;;
  stop) cmd_stop "$@" ;;
  run) cmd_run "$@" ;;
  -h | --help | help) usage ;;
  *) usage ;;
  esac
}

main "$@"
