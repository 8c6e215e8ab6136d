-- NEXMark q21, a channel id for each bid: a fixed id for the four hot
-- channels, else the channel_id parameter of the bid's url; bids with
-- neither are left out. (The reference's REGEXP_EXTRACT of group 2 is a
-- match test and a replacement by that group here.)
SELECT auction, bidder, price, channel,
       CASE
           WHEN lower(channel) = 'apple' THEN '0'
           WHEN lower(channel) = 'google' THEN '1'
           WHEN lower(channel) = 'facebook' THEN '2'
           WHEN lower(channel) = 'baidu' THEN '3'
           WHEN url ~ '(&|^)channel_id=([^&]*)'
               THEN regexp_replace(url, '^.*(&|^)channel_id=([^&]*).*$', '\2')
       END AS channel_id
FROM bid
WHERE url ~ '(&|^)channel_id=([^&]*)'
   OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')
