-- NEXMark q12, processing-time windows: bids per bidder in 10 s tumbling
-- windows of processing time. Our dialect has no processing-time clock a
-- query can read deterministically, and a micro-batch engine's processing
-- time is its epoch; so, as the reference generator stamps each event with
-- the time it is emitted at the configured rate, the window is taken over
-- that generation time (date_time). This keeps the query's shape and cost
-- (a keyed tumbling count) and makes its result verifiable.
SELECT bidder, count(*) AS bid_count,
       tumble(date_time, INTERVAL '10' SECOND) AS window_start
FROM bid
GROUP BY bidder, tumble(date_time, INTERVAL '10' SECOND)
