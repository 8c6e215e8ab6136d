-- NEXMark q7, highest bid: the bids with the top price in each 10 s tumbling window.
WITH windowed AS (
    SELECT tumble(date_time, INTERVAL '10' SECOND) AS window_start, auction, bidder, price, date_time
    FROM bid
),
top AS (
    SELECT window_start, max(price) AS max_price FROM windowed GROUP BY window_start
)
SELECT w.auction, w.price, w.bidder, w.date_time, w.window_start
FROM windowed w JOIN top t ON w.window_start = t.window_start AND w.price = t.max_price
