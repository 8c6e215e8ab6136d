-- A stream anti-joined (NOT EXISTS) with a changelog on a key with few
-- values: auctions of a category where neither parity of id has had more
-- than 5,000 auctions yet, from a running count per category and parity
-- that changes every epoch. Each key gains rows every epoch; once a count
-- passes 5,000 its category's auctions are taken back, all at once.
CREATE EXTERNAL TABLE auction STORED AS NEXMARK LOCATION 'auction' OPTIONS ('events' '${EVENTS}', 'events_per_epoch' '10000');
CREATE EXTERNAL TABLE cats STORED AS NEXMARK LOCATION 'auction' OPTIONS ('events' '${EVENTS}', 'events_per_epoch' '10000');
CREATE EXTERNAL TABLE out (id BIGINT, seller BIGINT, category BIGINT) STORED AS BLACKHOLE LOCATION 'out';
INSERT INTO out
SELECT a.id, a.seller, a.category
FROM auction a
WHERE NOT EXISTS (
  SELECT 1 FROM (SELECT category, id % 2 AS half, count(*) AS n FROM cats GROUP BY category, id % 2) c
  WHERE c.category = a.category AND c.n > 5000);
