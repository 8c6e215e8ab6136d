-- NEXMark q14, calculation: bids priced between 1 M and 50 M once scaled by
-- 0.908, each labelled by the hour it was made in (day 8-18, night up to 6
-- and from 20, other in between) and with the number of 'c' characters in
-- its extra field, counted by the count_char function.
SELECT auction, bidder, 0.908 * price AS price,
       CASE
           WHEN date_part('hour', date_time) >= 8 AND date_part('hour', date_time) <= 18 THEN 'dayTime'
           WHEN date_part('hour', date_time) <= 6 OR date_part('hour', date_time) >= 20 THEN 'nightTime'
           ELSE 'otherTime'
       END AS bid_time_type,
       date_time, extra, count_char(extra, 'c') AS c_counts
FROM bid
WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000
