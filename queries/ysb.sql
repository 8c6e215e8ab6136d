-- The Yahoo Streaming Benchmark: views per campaign in 10 s event-time
-- tumbling windows, written to Redis in YSB's layout, exactly once.
-- `skein ysb run` fills the {{...}} parts (brokers, Redis, topics) and runs
-- it at the default group size from a checkpoint directory: a restart
-- resumes after the last committed epoch.
--
-- Only the fields the query needs are declared: the JSON decoder skips the
-- others without parsing them. Ads map to campaigns in the sink through the
-- `SET <ad_id> <campaign_id>` keys YSB's setup (and `skein ysb setup`) puts
-- in Redis (YSB's RedisAdCampaignCache); counts of an ad without a campaign
-- go to the dead-letter topic. 'emit' 'updates' writes each epoch's counts
-- as HINCRBY deltas, each sink member's in one MULTI/EXEC with its epoch
-- marker (named by 'checkpoint') and the offsets they cover.
CREATE EXTERNAL TABLE ad_events (
  ad_id VARCHAR NOT NULL,
  event_type VARCHAR NOT NULL,
  event_time TIMESTAMP NOT NULL
) STORED AS KAFKA LOCATION '{{topic}}' OPTIONS (
  'bootstrap.servers' '{{brokers}}',
  'format' 'json',
  'parallelism' '{{parallelism}}',
  'max.records.per.pull' '{{max_records}}',
  'dead.letter.topic' '{{dead_letter_topic}}'
);

CREATE EXTERNAL TABLE campaign_windows (
  ad_id VARCHAR,
  window_start TIMESTAMP,
  seen_count BIGINT
) STORED AS REDIS LOCATION '{{redis}}' OPTIONS (
  'layout' 'ysb',
  'ad.column' 'ad_id',
  'emit' 'updates',
  'checkpoint' '{{checkpoint}}',
  'dead.letter.topic' '{{dead_letter_topic}}',
  'dead.letter.bootstrap.servers' '{{brokers}}'
);

INSERT INTO campaign_windows
SELECT ad_id, tumble(event_time, INTERVAL '10' SECOND) AS window_start, COUNT(*) AS seen_count
FROM ad_events
WHERE event_type = 'view'
GROUP BY ad_id, tumble(event_time, INTERVAL '10' SECOND);
