-- NEXMark q11, user sessions: how many bids each bidder makes per session,
-- a session ending after 10 s without a bid from that bidder.
WITH sessions AS (
    SELECT bidder, date_time,
           session(date_time, INTERVAL '10' SECOND) OVER (PARTITION BY bidder ORDER BY date_time) AS session_start
    FROM bid
)
SELECT bidder, count(*) AS bid_count, session_start,
       max(date_time) + INTERVAL '10' SECOND AS session_end
FROM sessions
GROUP BY bidder, session_start
