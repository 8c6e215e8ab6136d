#!/usr/bin/env bash
# Updating queries at two sizes, one query per process, pinned to one core:
# events/s (skein bench nexmark, 10,000 events per epoch) and peak RSS
# (/usr/bin/time). The figures docs/benchmarks.md quotes for issue #37.
#
#   scripts/updating_scale.sh SKEIN "4 9 15 16 17 18 19 20" "1000000 10000000" [CORE] [EXTRA]
#
# EXTRA is passed on to `skein bench nexmark` (e.g. "--state-memory unlimited").
set -euo pipefail
skein=${1:?the skein binary (a release build)}
queries=${2:-"4 9 15 16 17 18 19 20"}
sizes=${3:-"1000000 10000000"}
core=${4:-0}
read -r -a extra <<<"${5:-}"
printf '%-6s %10s %14s %12s\n' query events events/s "peak RSS MB"
for q in $queries; do
    for n in $sizes; do
        out=$(mktemp)
        /usr/bin/time -v taskset -c "$core" "$skein" bench nexmark --queries "$q" \
            --events "$n" --epochs $((n / 10000)) --repeat 1 --json "${extra[@]}" \
            2>"$out.time" >"$out"
        rate=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["queries"][0]; print(round(r.get("events_per_s_per_core", r.get("events_per_s", 0))))' "$out")
        rss=$(awk '/Maximum resident set size/ {printf "%.0f", $6 / 1024}' "$out.time")
        printf '%-6s %10s %14s %12s\n' "q$q" "$n" "$rate" "$rss"
        rm -f "$out" "$out.time"
    done
done
