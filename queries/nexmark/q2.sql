-- NEXMark q2, selection: the bids on every 123rd auction id (Flink's
-- predicate, auction % 123 = 0) with their price.
SELECT auction, price FROM bid WHERE auction % 123 = 0
