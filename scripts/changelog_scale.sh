#!/usr/bin/env bash
# Updating stages over a changelog at two sizes, pinned to one core, one run
# each: events/s (from `skein run --json`) and peak RSS (/usr/bin/time). The
# queries are queries/bench/changelog_*.sql (or those QUERIES names, e.g.
# "semi anti"), reading the in-process NEXMark
# generator (10,000 events per epoch) into BLACKHOLE. Give two binaries to
# compare a change against its baseline. The figures docs/benchmarks.md
# quotes for issue #37.
#
#   scripts/changelog_scale.sh "SKEIN [BASELINE_SKEIN]" "1000000 2000000" [CORE] [QUERIES]
set -euo pipefail
binaries=${1:?one or two skein binaries}
sizes=${2:-"1000000 2000000"}
core=${3:-0}
queries=${4:-}
here=$(cd "$(dirname "$0")/.." && pwd)
printf '%-16s %-10s %10s %12s %12s\n' query binary events events/s "peak RSS MB"
if [ -n "$queries" ]; then
    files=$(for q in $queries; do echo "$here/queries/bench/changelog_$q.sql"; done)
else
    files=$(ls "$here"/queries/bench/changelog_*.sql)
fi
for sql in $files; do
    name=$(basename "$sql" .sql)
    for n in $sizes; do
        file=$(mktemp --suffix=.sql)
        sed "s/\${EVENTS}/$n/g" "$sql" >"$file"
        i=0
        for skein in $binaries; do
            out=$(mktemp)
            /usr/bin/time -v taskset -c "$core" "$skein" run "$file" --until-drained \
                --no-checkpoint --interval 1ms --json 2>"$out.time" >"$out"
            rate=$(tail -1 "$out" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["events_per_s"]))')
            rss=$(awk '/Maximum resident set size/ {printf "%.0f", $6 / 1024}' "$out.time")
            label=$([ $i = 0 ] && echo this || echo baseline)
            printf '%-16s %-10s %10s %12s %12s\n' "$name" "$label" "$n" "$rate" "$rss"
            rm -f "$out" "$out.time"
            i=$((i + 1))
        done
        rm -f "$file"
    done
done
