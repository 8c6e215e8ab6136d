-- max and count(DISTINCT) over a changelog with few groups: per group of
-- sellers, the most auctions one seller has opened and how many distinct
-- counts there are; each epoch changes many sellers' counts.
CREATE EXTERNAL TABLE auction STORED AS NEXMARK LOCATION 'auction' OPTIONS ('events' '${EVENTS}', 'events_per_epoch' '10000');
CREATE EXTERNAL TABLE out (g BIGINT, most BIGINT, kinds BIGINT) STORED AS BLACKHOLE LOCATION 'out';
INSERT INTO out
SELECT seller % 10 AS g, max(n) AS most, count(DISTINCT n) AS kinds
FROM (SELECT seller, count(*) AS n FROM auction GROUP BY seller) s
GROUP BY seller % 10;
