-- NEXMark q5, hot items: the auctions with the most bids in each 10 s window
-- sliding every 5 s (Flock's N5). hop() lists the windows of each bid; unnest
-- gives a row per window, named window_start so the planner sees the window.
WITH bids AS (
    SELECT unnest(hop(date_time, INTERVAL '5' SECOND, INTERVAL '10' SECOND)) AS window_start, auction
    FROM bid
),
counts AS (
    SELECT window_start, auction, count(*) AS num
    FROM bids
    GROUP BY window_start, auction
),
top AS (
    SELECT window_start, max(num) AS max_num
    FROM counts
    GROUP BY window_start
)
SELECT c.auction, c.num, c.window_start
FROM counts c JOIN top t ON c.window_start = t.window_start AND c.num = t.max_num
