#!/usr/bin/env bash
# Source instances at the defaults against one forced: NEXMark published
# once with `skein gen` (4 partitions), then each query drained from Kafka
# with `skein run --until-drained` twice per round, at the defaults and with
# every table declared 'parallelism' '1', in turn (A B A B ...). Prints each
# side's median events/s (the run's own report: from its first pull to its
# last commit) and the median of the pairwise ratios, and what the defaults
# chose (from `skein explain --json`).
# Needs Kafka at 127.0.0.1:9092 (scripts/services.sh start kafka).
#
#   scripts/source_parallelism.sh SKEIN EVENTS "0 1 2 3 4 5 6 7 8" [ROUNDS]
set -euo pipefail
skein=${1:?the skein binary (a release build)}
events=${2:?events to publish}
queries=${3:-"0 1 2 3 4 5 7 8"}
rounds=${4:-3}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
brokers=127.0.0.1:9092
prefix="nx-sources-$events-$$"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$skein" gen nexmark --to "kafka://$brokers/$prefix" --events "$events" --partitions 4 --json >/dev/null
ddl() {
    local extra=$1
    table() {
        echo "CREATE EXTERNAL TABLE $1 ($2) STORED AS KAFKA LOCATION '$prefix-$1' OPTIONS ('bootstrap.servers' '$brokers', 'format' 'json'$extra);"
    }
    table person 'id BIGINT, name VARCHAR, email_address VARCHAR, credit_card VARCHAR, city VARCHAR, state VARCHAR, date_time TIMESTAMP, extra VARCHAR'
    table auction 'id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra VARCHAR'
    table bid 'auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, date_time TIMESTAMP, extra VARCHAR'
}
rate() {
    "$skein" run "$1" --until-drained --no-checkpoint --json 2>/dev/null \
        | python3 -c 'import json,sys; r=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(round(r["events"]/r["elapsed_s"]))'
}
median() { python3 -c 'import statistics,sys; print(round(statistics.median(float(x) for x in sys.argv[1:]), 2))' "$@"; }
printf '%-5s %-40s %14s %14s %8s\n' query "defaults chose" "defaults ev/s" "one ev/s" ratio
for q in $queries; do
    body=$(grep -v '^--' "$root/queries/nexmark/q$q.sql")
    { ddl ""; echo "$body"; echo ";"; } >"$work/a.sql"
    { ddl ", 'parallelism' '1'"; echo "$body"; echo ";"; } >"$work/b.sql"
    chose=$("$skein" explain "$work/a.sql" --json | python3 -c 'import json,sys; t=json.load(sys.stdin)["tables"]; print(", ".join(x["name"] + " " + str(x["parallelism"]) for x in t))')
    a=() b=() r=()
    for _ in $(seq "$rounds"); do
        x=$(rate "$work/a.sql"); y=$(rate "$work/b.sql")
        a+=("$x"); b+=("$y"); r+=("$(python3 -c "print($x/$y)")")
    done
    printf '%-5s %-40s %14s %14s %8s\n' "q$q" "$chose" "$(median "${a[@]}")" "$(median "${b[@]}")" "$(median "${r[@]}")x"
done
