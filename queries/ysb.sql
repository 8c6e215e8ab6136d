-- The Yahoo Streaming Benchmark: views per campaign in 10 s event-time
-- tumbling windows, written to Redis in YSB's layout, exactly once.
-- `skein ysb run` fills the {{...}} parts (brokers, Redis, topics) and runs
-- it at the default group size from a checkpoint directory: a restart
-- resumes after the last committed epoch.
--
-- Only the fields the query needs are declared: the JSON decoder skips the
-- others without parsing them. `campaigns` is a lookup table over the
-- `SET <ad_id> <campaign_id>` keys YSB's setup (and `skein ysb setup`) puts
-- in Redis: the join fetches each batch's unknown ads with one MGET, in the
-- stage that reads the topic, and caches them (YSB's RedisAdCampaignCache).
-- A view of an ad without a campaign goes to the dead-letter topic with
-- the reason ('lookup.missing' 'dead-letter'). `campaign_windows` is YSB's
-- result layout (STORED AS YSB_REDIS, docs/ysb.md); 'emit' 'updates' writes each
-- epoch's counts as HINCRBY deltas, each sink member's in one MULTI/EXEC
-- with its epoch marker (named by 'checkpoint') and the offsets they cover.
-- 'event_time' gives the epochs a watermark: no row is held back or dropped
-- (the counts are written every epoch), but the driver learns when event
-- time reaches a window's end and fires an epoch then, so a window's last
-- update lands a few ms after its end, not up to an interval later.
CREATE EXTERNAL TABLE ad_events (
  ad_id VARCHAR NOT NULL,
  event_type VARCHAR NOT NULL,
  event_time TIMESTAMP NOT NULL
) STORED AS KAFKA LOCATION '{{topic}}' OPTIONS (
  'bootstrap.servers' '{{brokers}}',
  'format' 'json',
  'event_time' 'event_time',
  'parallelism' '{{parallelism}}',
  'max.records.per.pull' '{{max_records}}',
  'dead.letter.topic' '{{dead_letter_topic}}'
);

CREATE EXTERNAL TABLE campaigns (
  ad_id VARCHAR NOT NULL,
  campaign_id VARCHAR NOT NULL
) STORED AS REDIS LOCATION '{{redis}}' OPTIONS (
  'lookup.key' 'ad_id',
  'lookup.cache.size' '100000',
  'lookup.cache.ttl.ms' '600000',
  'lookup.missing' 'dead-letter'
);

CREATE EXTERNAL TABLE campaign_windows (
  campaign_id VARCHAR,
  window_start TIMESTAMP,
  seen_count BIGINT
) STORED AS YSB_REDIS LOCATION '{{redis}}' OPTIONS (
  'emit' 'updates',
  'checkpoint' '{{checkpoint}}'
);

INSERT INTO campaign_windows
SELECT c.campaign_id, tumble(e.event_time, INTERVAL '10' SECOND) AS window_start,
       COUNT(*) AS seen_count
FROM ad_events e JOIN campaigns c ON e.ad_id = c.ad_id
WHERE e.event_type = 'view'
GROUP BY c.campaign_id, tumble(e.event_time, INTERVAL '10' SECOND);
