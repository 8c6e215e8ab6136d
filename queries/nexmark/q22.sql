-- NEXMark q22, the directories of each bid's url: the parts after the
-- host. The reference counts the '/'-separated parts from 0 and takes 3, 4
-- and 5; split_part counts from 1.
SELECT auction, bidder, price, channel,
       split_part(url, '/', 4) AS dir1,
       split_part(url, '/', 5) AS dir2,
       split_part(url, '/', 6) AS dir3
FROM bid
