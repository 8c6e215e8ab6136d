-- NEXMark q1, currency conversion: every bid with its price converted from
-- dollars to euros at the reference suite's fixed rate of 0.908.
SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid
