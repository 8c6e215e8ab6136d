-- A stream joined with a changelog on a key with few values (auctions with
-- their category from a DISTINCT, a dimension that rarely changes): each
-- key gains rows every epoch, for as long as the query runs.
CREATE EXTERNAL TABLE auction STORED AS NEXMARK LOCATION 'auction' OPTIONS ('events' '${EVENTS}', 'events_per_epoch' '10000');
CREATE EXTERNAL TABLE cats STORED AS NEXMARK LOCATION 'auction' OPTIONS ('events' '${EVENTS}', 'events_per_epoch' '10000');
CREATE EXTERNAL TABLE out (id BIGINT, seller BIGINT, category BIGINT) STORED AS BLACKHOLE LOCATION 'out';
INSERT INTO out
SELECT a.id, a.seller, c.category
FROM auction a JOIN (SELECT DISTINCT category, id % 2 AS half FROM cats) c ON a.category = c.category;
