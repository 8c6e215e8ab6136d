#!/usr/bin/env bash
# Starts, stops and reports the real services the integration tests use:
#
#   scripts/services.sh start  [SERVICE ...]   (default: kafka redis ministack)
#   scripts/services.sh stop   [SERVICE ...]
#   scripts/services.sh status [SERVICE ...]
#
#   kafka         Apache Kafka (KRaft, one broker+controller)  127.0.0.1:9092
#   redis         redis-server                                 127.0.0.1:6379
#   ministack     S3, Kinesis and Lambda stand-in              http://127.0.0.1:4566
#   kafka-outage  a second Kafka broker that keeps its data    127.0.0.1:9094
#                 across stop and start (controller on 9095; the ports come
#                 from KAFKA_OUTAGE_PORT and KAFKA_OUTAGE_CONTROLLER_PORT)
#
# Everything binds 127.0.0.1 only. Pids, logs and data live in .services/ of
# this clone (or $SKEIN_STATE); `stop` only ever signals processes whose pid
# file it wrote. kafka, redis and ministack start with fresh, empty state;
# kafka-outage starts with the data it had when it was stopped (remove
# .services/kafka-outage for a fresh one). Run scripts/setup.sh first.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# What start, stop and status act on when no service is named.
ALL_SERVICES=(kafka redis ministack)
KNOWN_SERVICES=(kafka redis ministack kafka-outage)

# --- helpers -------------------------------------------------------------------

port_open() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

pid_file() { echo "$SKEIN_STATE/$1/pid"; }

# Text that must appear in the command line of the process we started: guards
# against signalling an unrelated process that reused an old pid.
cmd_marker() {
    case $1 in
        kafka) echo "kafka.Kafka" ;;
        kafka-outage) echo "$SKEIN_STATE/kafka-outage/server.properties" ;;
        redis) echo "redis-server" ;;
        ministack) echo "ministack" ;;
    esac
}

# Prints the pid of the service if this clone started it and it still runs.
our_pid() {
    local file pid
    file="$(pid_file "$1")"
    [[ -f $file ]] || return 1
    pid="$(<"$file")"
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$(cmd_marker "$1")" || return 1
    echo "$pid"
}

service_port() {
    case $1 in
        kafka) echo "$KAFKA_PORT" ;;
        kafka-outage) echo "$KAFKA_OUTAGE_PORT" ;;
        redis) echo "$REDIS_PORT" ;;
        ministack) echo "$MINISTACK_PORT" ;;
    esac
}

need() {
    command -v "$1" >/dev/null || die "$1 not found: run scripts/setup.sh first"
}

# Starts "$@" in its own session (so `stop` can signal the whole process group,
# e.g. ministack's Lambda workers), detached from this shell, logging to $log.
launch() {
    local name=$1 log=$2
    shift 2
    setsid "$@" >"$log" 2>&1 </dev/null &
    echo $! >"$(pid_file "$name")"
}

# Waits until `$probe` succeeds; fails early with the log's tail if the process died.
wait_ready() {
    local name=$1 timeout=$2 probe=$3 pid log="$SKEIN_STATE/$1/log" t0=$SECONDS
    pid="$(<"$(pid_file "$name")")"
    until eval "$probe" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$(pid_file "$name")"
            tail -n 30 "$log" >&2 || true
            die "$name exited during startup (log above, full log: $log)"
        fi
        if ((SECONDS - t0 >= timeout)); then
            tail -n 30 "$log" >&2 || true
            die "$name not ready after ${timeout}s (log above, full log: $log); it is still running, pid $pid: scripts/services.sh stop $name"
        fi
        sleep 0.3
    done
    log "$name: ready in $((SECONDS - t0)) s (pid $pid, log $log)"
}

# Common preamble of every start_*: returns 1 when there is nothing to do.
# With a second argument of 1 the state of an earlier start is kept.
prepare_start() {
    local name=$1 keep=${2:-0} port pid
    port="$(service_port "$name")"
    if pid="$(our_pid "$name")"; then
        log "$name: already running (pid $pid)"
        return 1
    fi
    if port_open "$port"; then
        die "$name: port 127.0.0.1:$port is taken by a process this script did not start; stop it (see: ss -ltnp 'sport = :$port') and run scripts/services.sh start $name again"
    fi
    ((keep)) || rm -rf "${SKEIN_STATE:?}/$name"
    mkdir -p "$SKEIN_STATE/$name"
}

# --- Kafka ---------------------------------------------------------------------

kafka_cluster_id() {
    # 16 random bytes, base64url without padding. The tool takes an id that
    # starts with '-' for an option, so draw again.
    local id
    while :; do
        id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
        [[ $id != -* ]] && { echo "$id"; return; }
    done
}

start_kafka() {
    prepare_start kafka || return 0
    start_kafka_broker kafka "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"
}

# The same single-node broker on its own ports; a stop keeps its data (log
# segments and KRaft metadata), so the next start serves the same topics and
# offsets: a broker outage, not a new broker.
start_kafka-outage() {
    prepare_start kafka-outage 1 || return 0
    start_kafka_broker kafka-outage "$KAFKA_OUTAGE_PORT" "$KAFKA_OUTAGE_CONTROLLER_PORT"
}

# start_kafka_broker NAME PORT CONTROLLER_PORT: formats the storage in
# $SKEIN_STATE/NAME/data unless it holds a formatted one already.
start_kafka_broker() {
    local name=$1 port=$2 controller_port=$3
    need java
    [[ -f $KAFKA_LIBS/.complete ]] || die "Kafka jars not found in $KAFKA_LIBS: run scripts/setup.sh first"
    port_open "$controller_port" \
        && die "$name: controller port 127.0.0.1:$controller_port is taken by another process"

    local dir="$SKEIN_STATE/$name"
    cat >"$dir/server.properties" <<EOF
# Single-node KRaft: this process is both broker and controller.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/data
auto.create.topics.enable=true
num.partitions=1
# One broker: every internal topic has a single replica.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Tests create consumer groups and want them served at once.
group.initial.rebalance.delay.ms=0
EOF
    cat >"$dir/log4j2.properties" <<EOF
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
EOF
    local java_opts=(-Xmx512m -Xms128m -XX:+UseG1GC -Djava.awt.headless=true -Djava.net.preferIPv4Stack=true
                     "-Dlog4j2.configurationFile=$dir/log4j2.properties"
                     -cp "$KAFKA_LIBS/*")
    if [[ -f $dir/data/meta.properties ]]; then
        log "$name: keeping the data in $dir/data"
    else
        java "${java_opts[@]}" kafka.tools.StorageTool format \
            -t "$(kafka_cluster_id)" -c "$dir/server.properties" >"$dir/format.log" 2>&1 \
            || { cat "$dir/format.log" >&2; die "$name: formatting the storage failed"; }
    fi
    # launch truncates the log, so the readiness line below is this start's.
    launch "$name" "$dir/log" java "${java_opts[@]}" kafka.Kafka "$dir/server.properties"
    # The broker logs this once it serves clients on its listener.
    wait_ready "$name" 90 "grep -q 'Kafka Server started' '$dir/log' && port_open $port"
}

# --- Redis ---------------------------------------------------------------------

start_redis() {
    prepare_start redis || return 0
    need redis-server
    need redis-cli
    local dir="$SKEIN_STATE/redis"
    launch redis "$dir/log" redis-server --save '' --appendonly no \
        --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$dir" --daemonize no
    wait_ready redis 20 "[[ \$(redis-cli -h 127.0.0.1 -p $REDIS_PORT ping) == PONG ]]"
}

# --- ministack -----------------------------------------------------------------

start_ministack() {
    prepare_start ministack || return 0
    need curl
    [[ -x $MINISTACK_VENV/bin/ministack ]] \
        || die "ministack not found in $MINISTACK_VENV: run scripts/setup.sh first"
    local dir="$SKEIN_STATE/ministack"
    mkdir -p "$dir/tmp"
    # AWS_ENDPOINT_URL is handed to the Lambda bootstraps it runs, so functions
    # call back into this ministack. TMPDIR keeps its unpacked function code
    # inside our state directory, removed with it.
    launch ministack "$dir/log" env \
        BIND_HOST=127.0.0.1 GATEWAY_PORT="$MINISTACK_PORT" \
        AWS_ENDPOINT_URL="http://127.0.0.1:$MINISTACK_PORT" \
        AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}" \
        TMPDIR="$dir/tmp" LOG_LEVEL="${MINISTACK_LOG_LEVEL:-INFO}" \
        "$MINISTACK_VENV/bin/ministack"
    wait_ready ministack 60 "curl -fsS http://127.0.0.1:$MINISTACK_PORT/_ministack/health"
}

# --- stop and status ---------------------------------------------------------------

stop_service() {
    local name=$1 pid
    if ! pid="$(our_pid "$name")"; then
        rm -f "$(pid_file "$name")"
        log "$name: not running (started by this clone)"
        return 0
    fi
    # The whole process group: the service and any children it spawned.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    local t0=$SECONDS
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS - t0 >= 30)); then
            log "$name: still running after 30 s, sending SIGKILL"
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
    rm -f "$(pid_file "$name")"
    log "$name: stopped (pid $pid)"
}

status_service() {
    local name=$1 pid port
    port="$(service_port "$name")"
    if pid="$(our_pid "$name")"; then
        if port_open "$port"; then
            printf '%-12s running   pid %-8s 127.0.0.1:%s\n' "$name" "$pid" "$port"
        else
            printf '%-12s starting  pid %-8s 127.0.0.1:%s not open yet\n' "$name" "$pid" "$port"
        fi
    elif port_open "$port"; then
        printf '%-12s foreign   127.0.0.1:%s is taken by a process this script did not start\n' "$name" "$port"
    else
        printf '%-12s stopped\n' "$name"
    fi
}

# --- main ----------------------------------------------------------------------

usage() {
    # The header comment of this file, without its '#'.
    awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0" >&2
    exit 2
}

(($# >= 1)) || usage
action=$1
shift
services=("$@")
((${#services[@]} > 0)) || services=("${ALL_SERVICES[@]}")
for s in "${services[@]}"; do
    [[ " ${KNOWN_SERVICES[*]} " == *" $s "* ]] || { log "unknown service: $s"; usage; }
done
mkdir -p "$SKEIN_STATE"

case $action in
    start) for s in "${services[@]}"; do "start_$s"; done ;;
    stop) for s in "${services[@]}"; do stop_service "$s"; done ;;
    status) for s in "${services[@]}"; do status_service "$s"; done ;;
    *) usage ;;
esac
