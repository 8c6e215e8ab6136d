#!/usr/bin/env bash
# The test command: installs what is missing, starts the real services, runs
# every test of the workspace (debug build), and stops what it started.
#
#   scripts/test.sh [extra cargo test arguments]
#
# Exits non-zero if anything fails. .ci/run calls exactly this.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SKEIN_ROOT"

# One target directory outside the clone, shared by every clone on the machine:
# a fresh clone then rebuilds only what changed.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/skein-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

t0=$SECONDS
scripts/setup.sh
t_setup=$((SECONDS - t0))

# Services a test starts for itself (tests/ysb/kafka_outage.rs: a Kafka broker it
# stops and starts) live here; the tests stop them, and so does the exit
# handler if the run is interrupted.
export SKEIN_TEST_STATE="$SKEIN_STATE/tests"

# Stop only the services this run started; ones already running stay up.
started=()
cleanup() {
    local rc=$?
    if ((${#started[@]} > 0)); then
        scripts/services.sh stop "${started[@]}" || true
    fi
    local d
    for d in "$SKEIN_TEST_STATE"/*/; do
        [[ -d $d ]] && SKEIN_STATE="${d%/}" scripts/services.sh stop kafka-outage >/dev/null 2>&1 || true
    done
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for service in kafka redis ministack; do
    case "$(scripts/services.sh status "$service")" in
        *" running "*)
            log "$service: already running, leaving it as it is" ;;
        *" foreign "*)
            # e.g. left running by another clone: use it rather than fail, and
            # let the tests tell whether it is the service they expect.
            log "WARNING: $service: its port is held by a process this clone did not start; the tests will use it" ;;
        *)
            started+=("$service")
            scripts/services.sh start "$service" ;;
    esac
done

# Build first, so the test phase's time is the tests' own.
t1=$SECONDS
cargo test --workspace --no-run
# The Lambda bootstrap as it is packaged: without the CLI and DataFusion's
# SQL front end (docs/lambda.md, "Building the package"). A check, not a
# build: it fails if the function's code comes to need SQL planning.
cargo check --bin skein-function --no-default-features --features jemalloc
t_build=$((SECONDS - t1))

t2=$SECONDS
status=0
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$SKEIN_STATE/test-output.log" || status=$?
t_test=$((SECONDS - t2))

echo
echo "== summary =="
grep -E '^ +(Running|Doc-tests) |^test result:' "$SKEIN_STATE/test-output.log" || true
# Totals over cargo's per-binary "test result: ok. N passed; N failed; ..." lines.
count() {
    grep -E '^test result:' "$SKEIN_STATE/test-output.log" | grep -oE "[0-9]+ $1" \
        | awk '{s += $1} END {print s + 0}'
}
passed=$(count passed)
failed=$(count failed)
echo "setup ${t_setup} s, build ${t_build} s, tests ${t_test} s"
echo "${passed} passed, ${failed} failed"
exit "$status"
