-- NEXMark q13, bounded side-input join: every bid enriched with the value of
-- a small, fixed side table keyed by auction id modulo its size (the
-- reference reads 10,000 key/value rows from a file; here a CTE builds them).
WITH side_input AS (
    SELECT value AS key, concat('side-', CAST(value AS VARCHAR)) AS value
    FROM generate_series(0, 9999)
)
SELECT b.auction, b.bidder, b.price, b.date_time, s.value
FROM bid b JOIN side_input s ON b.auction % 10000 = s.key
