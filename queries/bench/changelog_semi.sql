-- A stream semi-joined (IN) with a changelog on a key with few values:
-- auctions whose category has had more than 100 auctions of an id's
-- parity, from a running count per category and parity that changes every
-- epoch. Each key gains rows every epoch, and the other side's rows of
-- every key are taken back and put again.
CREATE EXTERNAL TABLE auction STORED AS NEXMARK LOCATION 'auction' OPTIONS ('events' '${EVENTS}', 'events_per_epoch' '10000');
CREATE EXTERNAL TABLE cats STORED AS NEXMARK LOCATION 'auction' OPTIONS ('events' '${EVENTS}', 'events_per_epoch' '10000');
CREATE EXTERNAL TABLE out (id BIGINT, seller BIGINT, category BIGINT) STORED AS BLACKHOLE LOCATION 'out';
INSERT INTO out
SELECT a.id, a.seller, a.category
FROM auction a
WHERE a.category IN (SELECT category FROM (SELECT category, id % 2 AS half, count(*) AS n FROM cats GROUP BY category, id % 2) c WHERE c.n > 100);
