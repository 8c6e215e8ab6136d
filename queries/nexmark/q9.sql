-- NEXMark q9, winning bids: every auction with its winning bid, the highest
-- bid made during the auction's lifetime (earliest first among equal prices,
-- as Flink's; then bidder, channel and url so every tie is broken the same
-- way in every run).
WITH ranked AS (
    SELECT a.id, a.item_name, a.description, a.initial_bid, a.reserve,
           a.date_time, a.expires, a.seller, a.category, a.extra,
           b.auction, b.bidder, b.price, b.date_time AS bid_date_time, b.extra AS bid_extra,
           row_number() OVER (PARTITION BY a.id
                              ORDER BY b.price DESC, b.date_time, b.bidder, b.channel, b.url) AS rank
    FROM auction a JOIN bid b ON a.id = b.auction
    WHERE b.date_time BETWEEN a.date_time AND a.expires
)
SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, category,
       extra, auction, bidder, price, bid_date_time, bid_extra
FROM ranked
WHERE rank = 1
