-- YSB's query over the built-in YSB generator, for `skein cost`: views per
-- ad in 10 s event-time tumbling windows (queries/ysb.sql reads Kafka and
-- writes Redis; here the input is generated and the counts are dropped,
-- so what is measured is the query's own work). `skein cost` sets
-- 'events' and 'rate'.
CREATE EXTERNAL TABLE ad_events STORED AS YSB LOCATION 'ad_events'
  OPTIONS ('events' '1', 'rate' '1', 'partitions' '2');

CREATE EXTERNAL TABLE campaign_windows (
  ad_id VARCHAR,
  window_start TIMESTAMP,
  seen_count BIGINT
) STORED AS BLACKHOLE LOCATION 'ysb';

INSERT INTO campaign_windows
SELECT ad_id, tumble(event_time, INTERVAL '10' SECOND) AS window_start, COUNT(*) AS seen_count
FROM ad_events
WHERE event_type = 'view'
GROUP BY ad_id, tumble(event_time, INTERVAL '10' SECOND);
