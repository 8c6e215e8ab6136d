-- NEXMark q4, average price per category: the winning bid of an auction is
-- its highest bid made during the auction's lifetime; average those per
-- category.
WITH winning AS (
    SELECT a.id, a.category, max(b.price) AS final
    FROM auction a JOIN bid b ON a.id = b.auction
    WHERE b.date_time BETWEEN a.date_time AND a.expires
    GROUP BY a.id, a.category
)
SELECT category, avg(final) AS avg_price
FROM winning
GROUP BY category
