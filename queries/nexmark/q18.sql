-- NEXMark q18, the last bid of each bidder on each auction (deduplication):
-- the newest row per key. Among bids of one bidder on one auction made in
-- the same millisecond, the highest price and then the url win, so every
-- run keeps the same one.
SELECT auction, bidder, price, channel, url, date_time, extra
FROM (
    SELECT *, row_number() OVER (PARTITION BY bidder, auction
                                 ORDER BY date_time DESC, price DESC, url) AS rank_number
    FROM bid
)
WHERE rank_number <= 1
