#!/usr/bin/env bash
# YSB's own query (queries/ysb.sql: Kafka, the Redis lookup, 'emit' 'updates'
# into Redis) run as a standing query at 1 s epochs while events are
# published, stopped with SIGTERM; prints the checkpoint-store objects it
# wrote per epoch and what they were. Needs Kafka and Redis
# (scripts/services.sh start kafka redis).
#
#   scripts/ysb-standing-puts.sh [SKEIN_BINARY] [SECONDS] [RATE]
set -euo pipefail
skein=${1:-skein}
secs=${2:-42}
rate=${3:-20000}
dir=$(mktemp -d /tmp/ysb-standing.XXXXXX)
topic=ysb-standing-$(basename "$dir" | tr -dc 'a-zA-Z0-9')
"$skein" ysb setup --topic "$topic" --dir "$dir/gt" > "$dir/setup.log"
sed -e "s#{{topic}}#$topic#; s#{{brokers}}#${SKEIN_KAFKA:-127.0.0.1:9092}#; s#{{parallelism}}#2#" \
    -e "s#{{max_records}}#200000#; s#{{dead_letter_topic}}#$topic-dl#" \
    -e "s#{{redis}}#${SKEIN_REDIS:-redis://127.0.0.1:6379}#g; s#{{checkpoint}}#$topic#" \
    "$(dirname "$0")/../queries/ysb.sql" > "$dir/q.sql"
"$skein" ysb generate --topic "$topic" --dir "$dir/gt" --partitions 2 \
    --events $((secs * rate + rate)) --rate "$rate" > "$dir/gen.log" &
gen=$!
sleep 2 # the generator creates the topic
"$skein" run "$dir/q.sql" --interval 1s --group-size 1 --checkpoint-dir "$dir/ck" --json \
    > "$dir/run.json" 2> "$dir/run.err" &
run=$!
sleep "$secs"
kill -TERM "$run"
wait "$run"
wait "$gen"
python3 - "$dir/run.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
puts = v["cost"]["measured"]["checkpoint_puts"]
print(f"{v['epochs']} epochs, {v['events']} events, {puts} store objects: "
      f"{puts / max(v['epochs'], 1):.2f} per epoch (stopped: {v.get('stopped')})")
PY
echo "objects left in the store, by place:"
(cd "$dir/ck" && find . -type f | cut -d/ -f2-3 | sed 's#/[0-9]*\..*##' | sort | uniq -c)
rm -rf "$dir"
