-- NEXMark q6, average selling price by seller: for every closed auction, the
-- seller's average winning price over their last 10 closed auctions (that
-- one included). The reference suite orders a seller's auctions by when they
-- close; we order by `expires` and then auction id so ties are
-- deterministic, and use a 10-row window function where Beam keeps a
-- per-seller list (Flink cannot run q6 at all, FLINK-19059).
WITH winning AS (
    SELECT a.id, a.seller, a.expires, max(b.price) AS final
    FROM auction a JOIN bid b ON a.id = b.auction
    WHERE b.date_time BETWEEN a.date_time AND a.expires
    GROUP BY a.id, a.seller, a.expires
)
SELECT seller, id AS auction, final,
       avg(final) OVER (PARTITION BY seller ORDER BY expires, id
                        ROWS BETWEEN 9 PRECEDING AND CURRENT ROW) AS avg_price
FROM winning
