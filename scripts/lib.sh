# Shared settings for scripts/*.sh. Sourced, not run.
#
# Everything that is downloaded lives in a cache outside the clone, so a second
# run on the same machine is fast; nothing here requires that cache to exist.

SKEIN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SKEIN_CACHE="${SKEIN_CACHE:-$HOME/.cache/skein}"

KAFKA_VERSION="4.3.1"
LOG4J_VERSION="2.25.4"
MINISTACK_VERSION="1.5.33"
CONFLUENT_KAFKA_VERSION="2.16.1"

KAFKA_LIBS="$SKEIN_CACHE/kafka-$KAFKA_VERSION/libs"
MINISTACK_VENV="$SKEIN_CACHE/ministack-venv"
FORMATS_VENV="$SKEIN_CACHE/formats-venv"

# Runtime state of the services this clone started (pids, logs, data).
# Kept inside the clone so that two clones never stop each other's services.
SKEIN_STATE="${SKEIN_STATE:-$SKEIN_ROOT/.services}"

KAFKA_PORT=9092
KAFKA_CONTROLLER_PORT=9093
# A second broker that keeps its data across stop and start, for tests that
# stop a broker mid-run (tests/ysb/kafka_outage.rs starts its own, on free ports).
KAFKA_OUTAGE_PORT="${KAFKA_OUTAGE_PORT:-9094}"
KAFKA_OUTAGE_CONTROLLER_PORT="${KAFKA_OUTAGE_CONTROLLER_PORT:-9095}"
REDIS_PORT=6379
MINISTACK_PORT=4566

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Run as root directly, otherwise through sudo when there is one.
as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        die "need root to run: $* (no sudo found)"
    fi
}
