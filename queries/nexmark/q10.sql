-- NEXMark q10, log to file system: every bid with the day and minute
-- columns the reference partitions its files by. Written as a plain SELECT:
-- there is no local file / S3 sink in sinks/ yet; once there is, this
-- becomes `INSERT INTO <file table> SELECT ...` over the same columns.
SELECT auction, bidder, price, date_time, extra,
       to_char(date_time, '%Y-%m-%d') AS dt,
       to_char(date_time, '%H:%M') AS hm
FROM bid
