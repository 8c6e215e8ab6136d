-- NEXMark q10, log to file system: every bid, with the day and minute
-- columns the reference partitions its files by, written to files under
-- dt=<day>/hm=<hh:mm>/ directories of a local directory or S3 prefix.
-- `skein nexmark --query 10 [--output file:///dir | s3://bucket/prefix]`
-- fills in {{output}}. The files sink names objects by (query, epoch,
-- member), so a replayed epoch replaces its files instead of adding rows.
CREATE EXTERNAL TABLE bid_log (
  auction BIGINT NOT NULL,
  bidder BIGINT NOT NULL,
  price BIGINT NOT NULL,
  date_time TIMESTAMP NOT NULL,
  extra VARCHAR NOT NULL,
  dt VARCHAR,
  hm VARCHAR
) STORED AS FILES LOCATION '{{output}}' OPTIONS (
  'format' 'json',
  'partition.by' 'dt,hm'
);

INSERT INTO bid_log
SELECT auction, bidder, price, date_time, extra,
       to_char(date_time, '%Y-%m-%d') AS dt,
       to_char(date_time, '%H:%M') AS hm
FROM bid
