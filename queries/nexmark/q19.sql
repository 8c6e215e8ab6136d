-- NEXMark q19, the 10 highest bids of each auction (top-N), with their rank.
-- Equal prices are ordered by time, bidder and url, so every run ranks
-- them the same way.
SELECT * FROM (
    SELECT *, row_number() OVER (PARTITION BY auction
                                 ORDER BY price DESC, date_time, bidder, url) AS rank_number
    FROM bid
)
WHERE rank_number <= 10
