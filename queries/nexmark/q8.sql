-- NEXMark q8, monitor new users: the people who registered and opened an
-- auction within the same 10 s tumbling window.
WITH new_people AS (
    SELECT tumble(date_time, INTERVAL '10' SECOND) AS window_start, id, name
    FROM person
    GROUP BY tumble(date_time, INTERVAL '10' SECOND), id, name
),
new_sellers AS (
    SELECT tumble(date_time, INTERVAL '10' SECOND) AS window_start, seller
    FROM auction
    GROUP BY tumble(date_time, INTERVAL '10' SECOND), seller
)
SELECT p.id, p.name, p.window_start
FROM new_people p JOIN new_sellers s
  ON p.id = s.seller AND p.window_start = s.window_start
