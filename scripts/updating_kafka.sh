#!/usr/bin/env bash
# Updating queries read from Kafka: NEXMark published with `skein gen`, each
# query drained with `skein run --until-drained` at the defaults (the
# result printed: the run holds its changelog to add it up, which the peak
# RSS includes), one process per query. Prints events/s (the run's own report), peak RSS (/usr/bin/time)
# and the last `skein_state_rows` the run served (summed over members).
# Needs Kafka at 127.0.0.1:9092 (scripts/services.sh start kafka).
#
#   scripts/updating_kafka.sh SKEIN EVENTS "9 18 19 20"
set -euo pipefail
skein=${1:?the skein binary (a release build)}
events=${2:?events to publish}
queries=${3:-"9 18 19 20"}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
brokers=127.0.0.1:9092
prefix="nx-scale-$events-$$"
work=$(mktemp -d)
"$skein" gen nexmark --to "kafka://$brokers/$prefix" --events "$events" --partitions 4 --json >/dev/null
table() {
    echo "CREATE EXTERNAL TABLE $1 ($2) STORED AS KAFKA LOCATION '$prefix-$1' OPTIONS ('bootstrap.servers' '$brokers', 'format' 'json');"
}
ddl="$(table person 'id BIGINT, name VARCHAR, email_address VARCHAR, credit_card VARCHAR, city VARCHAR, state VARCHAR, date_time TIMESTAMP, extra VARCHAR')
$(table auction 'id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra VARCHAR')
$(table bid 'auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, date_time TIMESTAMP, extra VARCHAR')"
printf '%-6s %10s %12s %12s %12s\n' query events events/s "peak RSS MB" "state rows"
for q in $queries; do
    sql="$work/q$q.sql"
    { echo "$ddl"; grep -v '^--' "$root/queries/nexmark/q$q.sql"; echo ";"; } >"$sql"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$skein" explain "$sql" >/dev/null
    /usr/bin/time -v "$skein" run "$sql" --until-drained --no-checkpoint --json \
        --metrics "127.0.0.1:$port" >"$work/report" 2>"$work/time" &
    pid=$!
    # The last scrape before the run ends holds its last state rows.
    while kill -0 "$pid" 2>/dev/null; do
        curl -s "http://127.0.0.1:$port/metrics" >"$work/scrape.new" 2>/dev/null \
            && grep -q skein_state_rows "$work/scrape.new" && mv "$work/scrape.new" "$work/scrape"
        sleep 0.5
    done
    wait "$pid"
    rate=$(python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(round(r["events"]/r["elapsed_s"]))' "$work/report")
    rss=$(awk '/Maximum resident set size/ {printf "%.0f", $6 / 1024}' "$work/time")
    state=$(awk '/^skein_state_rows/ {s += $NF} END {print s + 0}' "$work/scrape" 2>/dev/null || echo "?")
    printf '%-6s %10s %12s %12s %12s\n' "q$q" "$events" "$rate" "$rss" "$state"
done
rm -rf "$work"
